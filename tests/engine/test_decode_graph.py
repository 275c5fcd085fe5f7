"""The compiled decode step (AOTInductor) gives the engine the same greedy tokens as transformers generate,
for one stream and for several, and the engine really decodes with it once it is built."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from radixchat.engine import decode_graph as G
from radixchat.engine.attention import paged_decode_usable
from radixchat.engine.core import EngineConfig, EngineCore
from radixchat.engine.kernels import load_paged_attention
from radixchat.engine.loader import describe_model
from radixchat.engine.request import SamplingParams
from radixchat.engine.weights import WeightsPlan, apply_weights, install_plan, kernel_unavailable
from tests.conftest import build_pair, hf_greedy, tiny_config

CPU = torch.device("cpu")


def _no_builder(*_args, **_kwargs):
    raise AssertionError("the graphs were built already: no builder may start")


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3"])  # the last two: sliding windows, outgrown
def test_compiled_decode_matches_generate_and_is_used(tmp_path, smol_tokenizer, monkeypatch, arch):
    model, ref = build_pair(tiny_config(arch))
    plan = apply_weights(model, "float32", CPU, tmp_path)  # the exact format: equality with generate holds
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    lm = replace(describe_model(model, smol_tokenizer, f"tiny-{arch}", model_dir), weights=plan)
    cfg = EngineConfig(kv_pool_tokens=2048, max_running_requests=4, compile="on", cache_dir=tmp_path)
    load_paged_attention()
    paged = paged_decode_usable(lm.head_dim, CPU)
    if why := G.compile_unavailable(model, CPU, paged):
        pytest.skip(why)
    spec = G.build_spec(lm, torch.float32, paged, 4)
    assert spec.ranges == [(1, 1), (2, 4)]
    # Build in this process (the engine would start a background builder), where the engine will look.
    G.compile_graphs(model, spec.ranges, tmp_path / "compiled" / spec.key, paged=paged)

    monkeypatch.setattr(G.DecodeGraphs, "_start_builder", _no_builder)
    core = EngineCore(lm, cfg)
    assert core.decode_compiled == "ready"
    graphs = core.runner.decode_graphs
    calls: list[int] = []
    real_lookup = graphs.lookup

    def counting_lookup(streams: int):
        graph = real_lookup(streams)
        if graph is not None:
            calls.append(streams)
        return graph

    graphs.lookup = counting_lookup
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 17, 9)]
    for batch in ([prompts[0]], prompts):  # one stream, then three together
        reqs = [core.make_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in batch]
        core.run_until_done(reqs)
        for p, r in zip(batch, reqs, strict=True):
            assert r.output_ids == hf_greedy(ref, p, 12)
    assert 1 in calls and 3 in calls  # both graphs decoded
    core.check_integrity()


def test_a_package_holds_no_copy_of_the_model_s_own_tensors(tmp_path, smol_tokenizer, monkeypatch):
    """The weights formats keep their copies as non-persistent buffers, which the export lifts into its
    constants: a package must not save them again (they were 335 MB per graph for the default model, read
    at every start and held twice in memory); the graph takes the serving model's own tensors."""
    model, _ = build_pair(tiny_config("llama"))
    if why := G.compile_unavailable(model, CPU, paged=False):
        pytest.skip(why)
    if kernel_unavailable("bfloat16", CPU):
        pytest.skip("no bfloat16 kernel on this machine")
    plan = WeightsPlan("bfloat16", {"layers": ((64, "bfloat16"), (1 << 62, "float32"))})
    install_plan(model, plan)
    own = G.module_tensors(G.DecodeStep(model))
    assert any(name.endswith(".w_bfloat16") for name in own)  # the format's copies are buffers
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    lm = replace(describe_model(model, smol_tokenizer, "tiny-llama", model_dir), weights=plan)
    load_paged_attention()
    paged = paged_decode_usable(lm.head_dim, CPU)
    spec = G.build_spec(lm, torch.float32, paged, 1)
    out = tmp_path / "compiled" / spec.key
    G.compile_graphs(model, spec.ranges, out, paged=paged)
    with safe_open(str(out / "decode-1-1.constants.safetensors"), framework="pt") as f:
        saved = set(f.keys())  # noqa: SIM118 (a safetensors file, not a dict)
    assert not saved & set(own), sorted(saved & set(own))[:5]
    monkeypatch.setattr(G.DecodeGraphs, "_start_builder", _no_builder)
    cfg = EngineConfig(kv_pool_tokens=1024, max_running_requests=1, compile="on", cache_dir=tmp_path)
    core = EngineCore(lm, cfg)  # one stream at most: the one graph built is all it needs
    req = core.make_request([5, 9, 2, 7], SamplingParams(max_tokens=6, ignore_eos=True))
    core.run_until_done([req])
    assert core.decode_compiled == "ready" and len(req.output_ids) == 6
    assert (out / "decode-1-1.unpacked").is_dir()  # unpacked once beside the package, not into /tmp


def _proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_an_engine_pauses_a_builder_that_another_process_left_running(tmp_path):
    """Quit the chat while its graphs build, start again: the second engine finds the first one's builder
    still running (it outlives its app) and must pause it while it decodes, as it would its own (a
    compiler beside the decode step took it to ~1 token/s). A stale lock naming another process is
    never adopted."""
    model, _ = build_pair(tiny_config("llama"))
    plan = apply_weights(model, "float32", CPU, tmp_path)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    spec = G.BuildSpec(str(model_dir), "float32", plan.as_json(), G.stream_ranges(plan.tables, 4))
    build_dir = tmp_path / "compiled" / spec.key
    build_dir.mkdir(parents=True)
    # stands in for the builder the first app started: its command line names the spec file, as a real one's
    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", str(build_dir / "spec.json")],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{other.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)  # Popen may return before the child's exec has set its command line
        (build_dir / "building.pid").write_text(str(other.pid))
        graphs = G.DecodeGraphs(model, spec, tmp_path)
        assert graphs.state == "compiling" and graphs._builder is None  # no second builder
        graphs.hold_builder(True)
        while _proc_state(other.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _proc_state(other.pid) == "T"  # paused while the engine is busy
        graphs.hold_builder(False)
        while _proc_state(other.pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _proc_state(other.pid) != "T"
    finally:
        other.kill()
        other.wait()
    assert not G._is_builder(os.getpid(), build_dir / "spec.json")  # a stale lock's pid: left alone
    assert not G._is_builder(other.pid, build_dir / "spec.json")  # gone
