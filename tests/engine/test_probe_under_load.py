"""A probe a busy machine cannot fool: ``weights = auto`` picks the same format with a CPU hog on every core
beside the probe as on the machine alone (issue: a probe taken under load once chose float32 and decoded at a
tenth of the speed). The real SmolLM2 shapes, the real kernels and a real hog: busy processes, one per CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from radixchat.engine import weights as W
from radixchat.machine import cpu_load

pytestmark = pytest.mark.real_model

# The hog: what a machine running other inference is busy with, products and copies through memory on all its
# cores (torch's OpenMP threads), one process per CPU. (A plain busy loop did not move the old probe.)
HOG = (
    "import torch\n"
    "a, b = torch.randn(1024, 1024), torch.randn(4096, 4096)\n"
    "while True:\n"
    "    a @ a\n"
    "    b.clone()\n"
)


def auto_choice(model) -> tuple[str, dict]:
    timings = W.run_probe(model, W.KERNELS)
    return W.plan_from_probe("auto", timings, torch.device("cpu")).format, timings


def test_a_cpu_hog_beside_the_probe_does_not_change_the_choice(smol_dir):
    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    alone, quiet = auto_choice(model)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(3.0)  # torch imported, the loop running
        assert all(h.poll() is None for h in hogs)
        busy_choice, busy = auto_choice(model)
        load = cpu_load()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    steps = {
        fmt: {"alone": W._step_time(W.plan_from_probe(fmt, quiet, torch.device("cpu")), quiet) * 1e3,
              "hog": W._step_time(W.plan_from_probe(fmt, busy, torch.device("cpu")), busy) * 1e3}
        for fmt in W.runnable_formats(torch.device("cpu"))
    }  # fmt: skip
    assert busy_choice == alone, (
        f"alone: {alone}, beside a hog: {busy_choice} (load {load:.2f}/CPU); ms: {steps}"
    )
