"""Equality is the oracle: whatever the engine does, greedy output == transformers generate()."""

from __future__ import annotations

import pytest
import torch

from radixchat.engine.core import EngineConfig, EngineCore
from radixchat.engine.request import SamplingParams
from tests.conftest import hf_greedy

ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


def make_prompts(seed: int, n: int = 8, shared: int = 40) -> list[list[int]]:
    """``n`` prompts sharing a ``shared``-token prefix, plus an exact duplicate of the first."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 512, (shared,), generator=g).tolist()
    prompts = [
        base + torch.randint(0, 512, (int(k),), generator=g).tolist()
        for k in torch.randint(1, 40, (n,), generator=g)
    ]
    prompts.append(list(prompts[0]))
    return prompts


def run(loaded, cfg: EngineConfig, prompts, n_tokens: int, ignore_eos: bool = True):
    core = EngineCore(loaded, cfg)
    reqs = [core.make_request(p, SamplingParams(max_tokens=n_tokens, ignore_eos=ignore_eos)) for p in prompts]
    core.run_until_done(reqs)
    core.check_integrity()
    return core, reqs


def assert_matches_hf(ref, prompts, reqs, n_tokens, eos_ids=None):
    for p, r in zip(prompts, reqs, strict=True):
        assert r.output_ids == hf_greedy(ref, p, n_tokens, eos_ids), f"request {r.rid} diverged"


CONFIGS = {
    "default": EngineConfig(kv_pool_tokens=4096, max_running_requests=16),
    "chunked": EngineConfig(kv_pool_tokens=4096, max_running_requests=16, chunked_prefill_size=7),
    "fcfs": EngineConfig(kv_pool_tokens=4096, schedule_policy="fcfs"),
    "no_cache": EngineConfig(kv_pool_tokens=4096, radix_cache=False),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_concurrent_requests_match_generate(tiny_models, arch, name):
    loaded, ref = tiny_models[arch]
    prompts = make_prompts(seed=ARCHS.index(arch) * 10 + list(CONFIGS).index(name))
    core, reqs = run(loaded, CONFIGS[name], prompts, 20)
    assert_matches_hf(ref, prompts, reqs, 20)
    if CONFIGS[name].radix_cache:
        assert core.scheduler.counters.cached_tokens >= 40 * (len(prompts) - 1)


@pytest.mark.parametrize("arch", ARCHS)
def test_eviction_and_retraction_keep_output_identical(tiny_models, arch):
    loaded, ref = tiny_models[arch]
    prompts = make_prompts(seed=7)
    cfg = EngineConfig(kv_pool_tokens=220, max_running_requests=16, chunked_prefill_size=16)
    core, reqs = run(loaded, cfg, prompts, 24)
    assert core.scheduler.counters.retractions > 0
    assert core.scheduler.counters.evicted_tokens > 0
    assert_matches_hf(ref, prompts, reqs, 24)


def test_identical_prompts_in_one_step_both_correct(tiny_models):
    loaded, ref = tiny_models["llama"]
    prompt = torch.randint(
        0, 512, (12,), generator=torch.Generator().manual_seed(3)
    ).tolist()  # < IN_BATCH_PREFIX_MIN
    core = EngineCore(loaded, EngineConfig(kv_pool_tokens=1024))
    reqs = [core.make_request(prompt, SamplingParams(max_tokens=12, ignore_eos=True)) for _ in range(2)]
    for r in reqs:
        core.add(r)
    batch, _ = core.schedule()
    assert batch is not None and set(batch.reqs) == set(reqs)  # both prefilled in the same step
    core.process(batch, core.forward_and_sample(batch))
    core.check_integrity()
    core.run_until_done()
    core.check_integrity()
    expect = hf_greedy(ref, prompt, 12)
    assert reqs[0].output_ids == expect and reqs[1].output_ids == expect


def test_request_sharing_a_long_uncached_prefix_waits_a_step_and_hits(tiny_models):
    loaded, ref = tiny_models["llama"]
    prompts = make_prompts(seed=5, n=2, shared=60)[:2]
    core = EngineCore(loaded, EngineConfig(kv_pool_tokens=1024))
    reqs = [core.make_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
    for r in reqs:
        core.add(r)
    batch, _ = core.schedule()
    assert batch is not None and batch.reqs == [reqs[0]]
    core.process(batch, core.forward_and_sample(batch))
    core.run_until_done()
    core.check_integrity()
    assert reqs[1].cached_tokens >= 60
    assert_matches_hf(ref, prompts, reqs, 8)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_multi_turn_reuses_prefix_and_matches(tiny_models, arch):
    loaded, ref = tiny_models[arch]
    core = EngineCore(loaded, EngineConfig(kv_pool_tokens=2048, chunked_prefill_size=16))
    g = torch.Generator().manual_seed(11)
    history: list[int] = []
    prev = None
    for turn in range(4):
        prompt = history + torch.randint(0, 512, (int(10 + 7 * turn),), generator=g).tolist()
        req = core.make_request(prompt, SamplingParams(max_tokens=10, ignore_eos=True))
        core.run_until_done([req])
        core.check_integrity()
        assert req.output_ids == hf_greedy(ref, prompt, 10)
        if prev is not None:
            # Everything of the previous turn except its last sampled token (which had no KV) is reused.
            assert req.cached_tokens >= len(prev.prompt_ids) + len(prev.output_ids) - 1
        history = prompt + req.output_ids
        prev = req


@pytest.mark.real_model
def test_real_model_concurrent_chat_matches_generate(smol, smol_tokenizer):
    loaded, ref = smol
    questions = [
        "What is the capital of France?",
        "Write a haiku about autumn.",
        "Explain recursion in one sentence.",
        "List three prime numbers.",
        "What is 12 times 7?",
        "Name a famous painter.",
        "Translate 'good morning' to Spanish.",
        "What is the capital of France?",  # identical to the first: shares everything
    ]
    prompts = [
        smol_tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    prompts = [smol_tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    cfg = EngineConfig(kv_pool_tokens=4096, chunked_prefill_size=32)
    core = EngineCore(loaded, cfg)
    reqs = [core.make_request(p, SamplingParams(max_tokens=24)) for p in prompts]
    core.run_until_done(reqs)
    core.check_integrity()
    assert_matches_hf(ref, prompts, reqs, 24, loaded.eos_ids)
    assert core.scheduler.counters.cached_tokens > 0


@pytest.mark.real_model
def test_real_model_under_memory_pressure_matches_generate(smol, smol_tokenizer):
    loaded, ref = smol
    msgs = [
        "Tell me about the moon.",
        "Describe a cat.",
        "What is Python?",
        "Give me a tip for sleeping well.",
    ]
    prompts = [
        smol_tokenizer.encode(
            smol_tokenizer.apply_chat_template(
                [{"role": "user", "content": m}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for m in msgs
    ]
    cfg = EngineConfig(kv_pool_tokens=100, chunked_prefill_size=16)
    core, reqs = run(loaded, cfg, prompts, 20, ignore_eos=False)
    assert core.scheduler.counters.retractions > 0
    assert_matches_hf(ref, prompts, reqs, 20, loaded.eos_ids)


def test_stale_pool_memory_never_reaches_attention(tiny_models):
    """Padded decode gathers must read only the dummy slot, never a free slot's stale (here: NaN) data."""
    loaded, ref = tiny_models["llama"]
    core = EngineCore(loaded, EngineConfig(kv_pool_tokens=1024, radix_cache=False))
    long = [list(range(1, 200))] * 4  # leaves long stale rows in the request table
    core.run_until_done([core.make_request(p, SamplingParams(max_tokens=4, ignore_eos=True)) for p in long])
    free = torch.tensor(sorted(core.pool.free_set()))
    for t in (*core.pool.k, *core.pool.v):
        t[free] = float("nan")
    prompts = make_prompts(seed=21, n=3, shared=5)
    reqs = [core.make_request(p, SamplingParams(max_tokens=10, ignore_eos=True)) for p in prompts]
    core.run_until_done(reqs)
    assert_matches_hf(ref, prompts, reqs, 10)
