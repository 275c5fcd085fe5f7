"""A model too large for this machine is one line before anything loads, and no compile builder starts
when the memory for it is not there. The large model is a real GGUF file whose tensor data is a hole in a
sparse file: its tensor table says 68.7 B parameters, and it takes a few blocks of disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from radixchat.bundled import SMOLLM2
from radixchat.engine import decode_graph as G
from radixchat.engine.loader import resolve_model
from radixchat.engine.model_size import available_memory, parameter_count
from radixchat.errors import ModelLoadError
from tests.conftest import build_pair, tiny_config

HUGE_PARAMS = 1 << 36  # 256 GiB as float32: more than any machine these tests run on


@pytest.fixture(scope="module")
def huge_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("huge") / "huge-70b.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor_info(
        "token_embd.weight",
        [1 << 20, 1 << 16],
        np.dtype(np.float32),
        HUGE_PARAMS * 4,
        GGMLQuantizationType.F32,
    )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with path.open("r+b") as f:  # the data section, aligned, as a hole
        f.truncate(-(-path.stat().st_size // 32) * 32 + HUGE_PARAMS * 4)
    assert available_memory() < HUGE_PARAMS * 4
    return path


def test_parameters_are_counted_from_headers_alone(smol, smol_dir, tmp_path):
    _, ref = smol
    expected = sum(p.numel() for p in ref.parameters())  # tied embeddings once, as the files hold them
    assert parameter_count(smol_dir) == expected
    assert parameter_count(SMOLLM2.gguf(tmp_path)) == expected
    assert parameter_count(smol_dir / "config.json") is None  # not a model file: nothing to say


def test_a_model_too_large_is_one_line_before_anything_loads(huge_gguf, tmp_path):
    with pytest.raises(ModelLoadError, match=r"needs about 256\.0 GiB .* GiB available") as err:
        resolve_model(str(huge_gguf), tmp_path)
    assert "huge-70b.gguf" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "radixchat",
            "--model",
            str(huge_gguf),
            "--cache-dir",
            str(tmp_path),
            "-p",
            "hi",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 3
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs about 256.0 GiB" in lines[0]


def test_no_builder_starts_without_the_memory_for_it(huge_gguf, tmp_path, smol_dir):
    assert G.builder_memory_problem(smol_dir) is None
    model, _ = build_pair(tiny_config("llama"))
    spec = G.BuildSpec(str(huge_gguf), "float32", {"format": "float32", "tables": {}}, [(1, 1)])
    graphs = G.DecodeGraphs(model, spec, tmp_path)
    assert graphs.state.startswith("off: its builder needs about 512.0 GiB")
    assert graphs._builder is None and not (graphs.dir / "building.pid").exists()
