"""The first vector-math op of a process is as exact as every later one, once ``radixchat.engine`` is imported.

torch's MKL-backed cos/sin/exp (``at::vml``) initialise lazily, and two threads making the first call at once
could get a ~12-bit result on one half (``radixchat/engine/_mkl.py``): RoPE's cos at the first prefill, so the
same prompt gave other logits, and a deterministic reply another text, in ~15% of processes. Each process below
runs what ``radixchat.engine`` runs first, then makes its first cos on two threads; sixteen of them miss an
inexact one with a chance of ~7% where the race is as frequent as it was here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import radixchat.engine
from radixchat.engine import _mkl

CHILD = r"""
import runpy, sys
import torch
runpy.run_path(sys.argv[1])
torch.set_num_threads(2)
x = (torch.arange(78.0)[:, None] * torch.logspace(0, -4, 64)[None, :]).contiguous()
print((x.cos().double() - x.double().cos()).abs().max().item())
"""


def test_the_engine_package_initialises_the_vector_math_before_anything_else():
    first = Path(radixchat.engine.__file__).read_text().split("\nimport ", 1)[1].split()[0]
    assert first == "radixchat.engine._mkl"


def test_the_first_parallel_cos_of_a_process_is_exact_after_the_initialisation():
    for _ in range(16):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, _mkl.__file__], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert float(out.stdout) < 1e-6, f"the first cos was off by {out.stdout.strip()}"
