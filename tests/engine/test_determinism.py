"""Deterministic inference: a greedy (or seeded) reply is a function of its prompt alone — alone or beside
others, under eviction and retraction, from the radix cache, the KV store or a fresh prefill, in this process
or a new one, across chunked-prefill boundaries (issue 33)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from radixchat.chat.engine_settings import engine_from_settings
from radixchat.config import Settings
from radixchat.engine import EngineConfig, SamplingParams
from radixchat.engine.core import EngineCore
from radixchat.engine.kernels import load_paged_attention
from radixchat.engine.loader import describe_model
from radixchat.engine.weights import apply_weights, row_invariant, uniform_plan
from tests.conftest import build_pair, tiny_config

if why := load_paged_attention():
    pytest.skip(f"deterministic inference needs the native kernels: {why}", allow_module_level=True)

CPU = torch.device("cpu")
PROMPTS = [
    "Write a haiku about the sea.",
    "What is the capital of France? Answer in one sentence.",
    "List three uses of a paperclip.",
    "Explain recursion to a child.",
    "Translate 'good morning' into Spanish and German.",
    "Give me a short motivational quote.",
    "What is 17 times 23? Show your steps.",
    "Describe a sunset in two sentences.",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _tiny_core(tmp_path, **cfg) -> EngineCore:
    model, _ = build_pair(tiny_config("llama"))
    plan = apply_weights(model, "auto", CPU, tmp_path, deterministic=True)
    assert all(len(t) == 1 for t in plan.tables.values()), plan.name  # one kernel for every row count
    lm = describe_model(model, None, "tiny-llama", tmp_path)
    lm.weights = plan
    core = EngineCore(lm, EngineConfig(kv_dtype="float16", deterministic=True, cache_dir=tmp_path, **cfg))
    assert core.runner.decode_graphs is None and core.runner.unified
    return core


def _run(core: EngineCore, prompts: list[list[int]], params: SamplingParams = GREEDY) -> list[list[int]]:
    reqs = [core.make_request(p, params) for p in prompts]
    core.run_until_done(reqs)
    core.check_integrity()
    return [r.output_ids for r in reqs]


def _prompts(n: int, seed: int = 0, length: int = 40) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (length + 7 * i,), generator=g).tolist() for i in range(n)]


def test_a_deterministic_plan_uses_one_batch_invariant_kernel_per_group(tmp_path):
    model, _ = build_pair(tiny_config("llama"))
    plan = apply_weights(model, "auto", CPU, tmp_path, deterministic=True)
    for layer in (m for m in model.modules() if hasattr(m, "table")):
        assert len(layer.table) == 1 and row_invariant(layer, layer.table[0][1])
    assert "float32" not in {t[0][1] for t in plan.tables.values()}  # the BLAS's small-row path is not


def test_the_deterministic_plan_takes_one_kernel_weighing_decode_and_prefill():
    timings = {
        "layers": {
            "1": {"float32": 9.0, "bfloat16": 5.0, "float16": 2.0},
            "8": {"float32": 9.5, "bfloat16": 5.5, "float16": 9.0},
            "512": {"float32": 150.0, "bfloat16": 70.0, "float16": 600.0},
        },
        "head": {"1": {"float32": 9.0, "float16": 2.0}, "8": {"float32": 17.0, "float16": 12.0}},
    }
    both = {"layers": {"bfloat16", "float16", "float32x8"}, "head": {"float16", "float32x8"}}
    # float16: 2 + 8 * 600 / 512 = 11.4 per row against bfloat16's 5 + 8 * 70 / 512 = 6.1
    plan = uniform_plan("float16", timings, CPU, both)
    assert plan.tables == {"layers": ((1 << 62, "bfloat16"),), "head": ((1 << 62, "float16"),)}
    only16 = {"layers": {"float16"}, "head": {"float16"}}  # bfloat16 not batch-invariant here
    assert uniform_plan("float16", timings, CPU, only16).tables["layers"] == ((1 << 62, "float16"),)


def test_without_a_batch_invariant_kernel_deterministic_mode_is_refused():
    from radixchat.errors import ConfigError

    timings = {"layers": {"1": {"float32": 1.0}, "512": {"float32": 9.0}}}
    with pytest.raises(ConfigError, match="batch-invariant"):
        uniform_plan("float32", timings, CPU, {"layers": set()})


def test_tiny_model_replies_do_not_depend_on_the_batch_the_chunks_or_the_cache(tmp_path):
    prompts = _prompts(6)
    alone_core = _tiny_core(tmp_path)
    alone = []
    for p in prompts:
        alone_core.cache.reset()
        alone += _run(alone_core, [p])
    together = _tiny_core(tmp_path, chunked_prefill_size=16)  # chunk edges everywhere, mixed batches
    assert _run(together, prompts) == alone
    assert _run(together, prompts) == alone  # again, from the radix cache
    # a prefix hit that splits a node: a prompt sharing the first 20 tokens of another, then that one
    split = [prompts[0][:20] + prompts[1][20:], prompts[0]]
    assert _run(together, split)[1] == alone[0]
    pressed = _tiny_core(tmp_path, kv_pool_tokens=200, max_running_requests=3, chunked_prefill_size=32)
    out = _run(pressed, prompts)
    assert pressed.scheduler.counters.retractions + pressed.scheduler.counters.evicted_tokens > 0
    assert out == alone


def _kv(core: EngineCore, ids: list[int]) -> list[torch.Tensor]:
    """The K/V the tree holds for ``ids`` (every layer's, in position order)."""
    slots = core.cache.match_prefix(ids).slots
    assert slots.numel() == len(ids)
    return [t[slots] for t in (*core.pool.k, *core.pool.v)]


def test_a_tokens_kv_is_the_same_bits_decoded_or_prefilled_alone_or_batched(tmp_path):
    """The property behind every equality above: a token's K/V in every layer is the same bits whether a
    decode step wrote it (beside other streams, or alone) or a prefill chunk did (of any size) — so a
    conversation continued from the cache or the KV store computes what a fresh prefill would."""
    prompts = _prompts(4, seed=2)
    decoded = _tiny_core(tmp_path)
    replies = _run(decoded, prompts)  # all four decoded side by side
    histories = [p + r[:-1] for p, r in zip(prompts, replies)]  # what each reply left in the tree
    for chunk in (512, 16):
        fresh = _tiny_core(tmp_path, chunked_prefill_size=chunk)
        for h in histories:
            fresh.run_until_done([fresh.make_request(h, SamplingParams(max_tokens=1))])
            for a, b in zip(_kv(decoded, h), _kv(fresh, h)):
                assert torch.equal(a, b), chunk


def test_tiny_model_seeded_sampling_does_not_depend_on_the_batch(tmp_path):
    prompts = _prompts(4, seed=1)
    seeded = SamplingParams(temperature=0.8, top_p=0.95, seed=7, max_tokens=20, ignore_eos=True)
    core = _tiny_core(tmp_path)
    alone = []
    for p in prompts:
        core.cache.reset()
        alone += _run(core, [p], seeded)
    assert _run(core, prompts, seeded) == alone


# -- the bundled model, as a user runs it ---------------------------------------------------------------


def _settings(**kw) -> Settings:
    return Settings(weights="auto", kv_dtype="auto", compile="off", deterministic=True, kv_store=False, **kw)


def _chat_ids(tok, text: str) -> list[int]:
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tok(rendered, add_special_tokens=False).input_ids


@pytest.mark.real_model
async def test_the_bundled_model_replies_alike_alone_batched_under_pressure_and_from_the_cache(tmp_path):
    """The issue's experiment on the default fast path with deterministic = on: eight prompts, each alone, all
    eight at once, all eight under a pool small enough to evict and retract (160 tokens, 3 running), and each twice (the second copy
    from the radix cache): every reply equals the reply the prompt gets alone."""
    engine = engine_from_settings(_settings())
    assert engine.core.runner.unified and engine.core.decode_compiled == "off"
    assert all(len(t) == 1 for t in engine.loaded.weights.tables.values())
    async with engine:
        ids = [_chat_ids(engine.tokenizer, p) for p in PROMPTS]
        alone = []
        for p in ids:
            engine.call(engine.core.cache.reset)
            alone.append((await engine.generate(p, GREEDY)).token_ids)
            again = await engine.generate(p, GREEDY)  # from the radix cache
            assert again.usage.cached_tokens == len(p) - 1 and again.token_ids == alone[-1]
        engine.call(engine.core.cache.reset)
        together = [await h.result() for h in [engine.submit(p, GREEDY) for p in ids]]
        assert [c.token_ids for c in together] == alone
        seeded = SamplingParams(temperature=0.7, top_p=0.9, seed=11, max_tokens=24, ignore_eos=True)
        sampled_alone = []
        for p in ids[:4]:
            engine.call(engine.core.cache.reset)
            sampled_alone.append((await engine.generate(p, seeded)).token_ids)
        sampled = [await h.result() for h in [engine.submit(p, seeded) for p in ids[:4]]]
        assert [c.token_ids for c in sampled] == sampled_alone
    pressed = engine_from_settings(_settings(kv_pool_tokens=160, max_running_requests=3))
    async with pressed:
        out = [await h.result() for h in [pressed.submit(p, GREEDY) for p in ids]]
        counters = pressed.core.scheduler.counters
        assert counters.retractions + counters.evicted_tokens > 0
        assert [c.token_ids for c in out] == alone


@pytest.mark.real_model
def test_the_bundled_model_replies_alike_in_a_new_process_and_from_a_continued_session(tmp_path):
    """Batch mode, deterministic: each prompt alone in its own process, then all eight in one; and a
    conversation continued from its saved session (and KV store) in a new process answers its second turn as
    the same conversation run whole does."""
    env = {
        **os.environ,
        "RADIXCHAT_WEIGHTS": "auto",
        "RADIXCHAT_KV_DTYPE": "auto",
        "RADIXCHAT_COMPILE": "off",
    }
    base = [sys.executable, "-m", "radixchat", "--deterministic", "--batch", "-", "--ordered"]

    def batch(lines: list[dict], *flags: str) -> list[dict]:
        out = subprocess.run(
            [*base, *flags],
            input="".join(json.dumps(line) + "\n" for line in lines),
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return [json.loads(line) for line in out.stdout.splitlines()]

    lines = [{"id": i, "turns": [p], "max_tokens": 24, "temperature": 0} for i, p in enumerate(PROMPTS)]
    alone = [batch([line])[0]["reply"] for line in lines[:4]]
    together = [r["reply"] for r in batch(lines[:4])]
    assert together == alone
    sessions, cache = tmp_path / "sessions", _borrowed_cache(tmp_path)
    chat = {
        "id": "chat",
        "turns": [PROMPTS[0], "Now one about mountains."],
        "max_tokens": 24,
        "temperature": 0,
    }
    whole = batch([chat])  # the second turn over the first turn's decoded tokens, from the radix cache
    store = ("--kv-store", "--cache-dir", str(cache))
    first = batch([{**chat, "turns": chat["turns"][:1]}], "--save-sessions", str(sessions), *store)
    assert first[0]["reply"] == whole[0]["reply"]
    cont = {
        "id": "cont",
        "session": str(sessions / "chat.json"),
        "turns": chat["turns"][1:],
        "max_tokens": 24,
    }
    from_store = batch([cont], *store)  # its KV loaded from the disk store
    fresh = batch([cont])  # the whole history prefilled again
    assert from_store[0]["usage"]["cached_tokens"] > 0 and fresh[0]["usage"]["cached_tokens"] == 0
    assert from_store[0]["reply"] == fresh[0]["reply"] == whole[1]["reply"]


def _borrowed_cache(tmp_path: Path) -> Path:
    """The user's cache (the converted model, the probes, the kernels), without its KV store."""
    from radixchat.config import default_cache_dir

    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in default_cache_dir().iterdir():
        if entry.name != "kv":
            (cache / entry.name).symlink_to(entry)
    return cache
