"""The compiled decode step (AOTInductor) gives the engine the same greedy tokens as transformers generate,
for one stream and for several, and the engine really decodes with it once it is built."""

from __future__ import annotations

import pytest
import torch

from radixchat.engine import decode_graph as G
from radixchat.engine.core import EngineConfig, EngineCore
from radixchat.engine.loader import describe_model
from radixchat.engine.request import SamplingParams
from radixchat.engine.weights import apply_weights
from tests.conftest import build_pair, hf_greedy, tiny_config

CPU = torch.device("cpu")


def test_compiled_decode_matches_generate_and_is_used(tmp_path, smol_tokenizer, monkeypatch):
    model, ref = build_pair(tiny_config("llama"))
    if why := G.compile_unavailable(model, CPU):
        pytest.skip(why)
    plan = apply_weights(model, "float32", CPU, tmp_path)  # the exact format: equality with generate holds
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    lm = describe_model(model, smol_tokenizer, "tiny-llama", model_dir)
    cfg = EngineConfig(kv_pool_tokens=2048, max_running_requests=4, compile="on", cache_dir=tmp_path)
    spec = G.BuildSpec(str(model_dir), "float32", plan.as_json(), G.stream_ranges(plan.tables, 4))
    assert spec.ranges == [(1, 1), (2, 4)]
    # Build in this process (the engine would start a background builder), where the engine will look.
    G.compile_graphs(model, spec.ranges, tmp_path / "compiled" / spec.key)

    def no_builder(*_args, **_kwargs):
        raise AssertionError("the graphs were built already: no builder may start")

    monkeypatch.setattr(G.DecodeGraphs, "_start_builder", no_builder)
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
