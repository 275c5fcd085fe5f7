"""The KV store keeps output exact: greedy output after a reload from disk, or after a spill and a
reload, equals transformers generate() and the output of an engine that never went to disk."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from radixchat.engine import Engine, EngineConfig, SamplingParams
from radixchat.engine.core import EngineCore
from radixchat.engine.kvstore.fingerprint import model_fingerprint
from radixchat.engine.loader import describe_model
from radixchat.engine.weights import WeightsPlan
from tests.conftest import build_pair, hf_greedy, tiny_config


def rand_ids(seed: int, n: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def store_cfg(tmp_path, **kw) -> EngineConfig:
    return EngineConfig(**{"kv_pool_tokens": 2048, "kv_store_dir": tmp_path, **kw})


def reply(core: EngineCore, ids: list[int], n: int = 12):
    req = core.make_request(ids, SamplingParams(max_tokens=n, ignore_eos=True))
    core.run_until_done([req])
    core.check_integrity()
    return req


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_reloaded_session_continues_exactly_like_generate(tiny_models, tmp_path, arch):
    loaded, ref = tiny_models[arch]
    first = rand_ids(1, 300)
    a = EngineCore(loaded, store_cfg(tmp_path))
    history = first + reply(a, first).output_ids
    saved = a.kv_tier.save(history, "s")
    assert saved.notice is None and saved.tokens == len(history) - 1  # the last token has no KV yet
    turn2 = history + rand_ids(2, 25)
    without_reload = reply(a, turn2).output_ids

    b = EngineCore(loaded, store_cfg(tmp_path))  # a fresh engine, as after reopening the app
    loaded_now = b.kv_tier.load(history)
    assert (loaded_now.cached_tokens, loaded_now.loaded_tokens) == (0, saved.tokens)
    b.check_integrity()
    assert [n.from_disk for n in b.cache.snapshot()] == [True]
    req = reply(b, turn2)
    assert req.cached_tokens == saved.tokens
    assert req.output_ids == without_reload == hf_greedy(ref, turn2, 12)


def test_a_request_loads_the_stored_prefix_on_admission(tiny_models, tmp_path):
    loaded, ref = tiny_models["llama"]
    first = rand_ids(3, 200)
    a = EngineCore(loaded, store_cfg(tmp_path))
    history = first + reply(a, first).output_ids
    a.kv_tier.save(history, "s")
    turn2 = history + rand_ids(4, 10)
    b = EngineCore(loaded, store_cfg(tmp_path))
    req = reply(b, turn2)
    assert req.cached_tokens == len(history) - 1
    assert b.scheduler.counters.loaded_tokens == len(history) - 1
    assert b.scheduler.counters.computed_tokens == len(turn2) - req.cached_tokens + 11
    assert req.output_ids == hf_greedy(ref, turn2, 12)


def test_load_extends_what_the_tree_already_holds(tiny_models, tmp_path):
    loaded, ref = tiny_models["llama"]
    full = rand_ids(5, 260)
    a = EngineCore(loaded, store_cfg(tmp_path))
    reply(a, full)
    a.kv_tier.save(full, "s")
    b = EngineCore(loaded, store_cfg(tmp_path))
    reply(b, full[:100])  # the tree holds 99 + 11 tokens, diverging after 100
    res = b.kv_tier.load(full)
    assert res.cached_tokens == 100 and res.warm_tokens == 260
    b.check_integrity()
    turn = full + rand_ids(6, 5)
    assert reply(b, turn).output_ids == hf_greedy(ref, turn, 12)


def test_spilled_conversations_come_back_from_disk_exactly(tiny_models, tmp_path):
    """A pool too small for four conversations: round two finds round one's KV on disk, not in the pool."""
    loaded, ref = tiny_models["llama"]
    cfg = store_cfg(tmp_path, kv_pool_tokens=330, max_running_requests=2, kv_spill=True)
    core = EngineCore(loaded, cfg)
    firsts = [rand_ids(10 + i, 140) for i in range(4)]
    histories = []
    for ids in firsts:
        histories.append(ids + reply(core, ids).output_ids)
    turns = [h + rand_ids(20 + i, 8) for i, h in enumerate(histories)]
    reqs = [core.make_request(t, SamplingParams(max_tokens=12, ignore_eos=True)) for t in turns]
    core.run_until_done(reqs)
    core.check_integrity()
    counters = core.scheduler.counters
    assert counters.evicted_tokens > 0 and counters.spilled_tokens > 0
    assert counters.loaded_tokens >= 140
    assert reqs[0].cached_tokens >= 140  # evicted by the later conversations, reloaded from disk
    for turn, req in zip(turns, reqs):
        assert req.output_ids == hf_greedy(ref, turn, 12)


def test_without_spill_evicted_kv_is_recomputed_not_stored(tiny_models, tmp_path):
    loaded, _ = tiny_models["llama"]
    core = EngineCore(loaded, store_cfg(tmp_path, kv_pool_tokens=330, kv_spill=False))
    for i in range(4):
        reply(core, rand_ids(10 + i, 140))
    assert core.scheduler.counters.evicted_tokens > 0
    assert core.scheduler.counters.spilled_tokens == 0 and core.kv_tier.store.num_blocks == 0


def test_store_off_and_radix_cache_off_have_no_tier(tiny_models, tmp_path):
    loaded, _ = tiny_models["llama"]
    assert EngineCore(loaded, EngineConfig(kv_pool_tokens=512)).kv_tier is None
    assert EngineCore(loaded, store_cfg(tmp_path, radix_cache=False)).kv_tier is None


def test_fingerprint_names_weights_dtype_and_format(tiny_models, smol_tokenizer):
    loaded, _ = tiny_models["llama"]
    fp = model_fingerprint(loaded)

    def describe(model):
        return describe_model(model, smol_tokenizer, "x", loaded.path)

    same = describe(build_pair(tiny_config("llama"))[0])
    assert model_fingerprint(same) == fp  # same weights, another object, another name
    assert model_fingerprint(describe(build_pair(tiny_config("llama"), seed=1)[0])) != fp
    assert model_fingerprint(describe(build_pair(tiny_config("llama"), dtype=torch.bfloat16)[0])) != fp
    assert (
        model_fingerprint(
            dataclasses.replace(loaded, weights=WeightsPlan("int4", {"layers": ((1 << 62, "int4"),)}))
        )
        != fp
    )
    one_value = build_pair(tiny_config("llama"))[0]
    with torch.no_grad():
        one_value.model.layers[1].self_attn.k_proj.weight[0, 0] += 1.0  # the first value is sampled
    assert model_fingerprint(describe(one_value)) != fp


async def test_engine_api_saves_loads_lists_and_deletes(tiny_models, tmp_path):
    loaded, ref = tiny_models["llama"]
    first = rand_ids(30, 150)
    async with Engine(loaded, store_cfg(tmp_path, debug=True)) as a:
        out = await a.generate(first, SamplingParams(max_tokens=10, ignore_eos=True))
        history = first + out.token_ids
        saved = await asyncio.to_thread(a.save_kv, history, "chat 1")
        assert saved.tokens == len(history) - 1 and saved.written_bytes > 0
    after_stop = a.save_kv(history, "chat 1")
    assert after_stop.tokens == 0 and "stopped" in after_stop.notice

    async with Engine(loaded, store_cfg(tmp_path, debug=True)) as b:
        usage = b.kv_store_usage()
        assert set(usage.owners) == {"chat 1"}
        assert usage.owners["chat 1"].tokens == saved.tokens
        assert usage.owners["chat 1"].bytes == usage.total_bytes == saved.written_bytes
        res = await asyncio.to_thread(b.load_kv, history)
        assert res.loaded_tokens == saved.tokens
        assert any(n.from_disk for n in b.stats().tree)
        turn2 = history + rand_ids(31, 6)
        out2 = await b.generate(turn2, SamplingParams(max_tokens=10, ignore_eos=True))
        assert out2.usage.cached_tokens == saved.tokens
        assert out2.token_ids == hf_greedy(ref, turn2, 10)
        assert b.stats().kv_loaded_tokens == saved.tokens
        assert b.rename_kv("chat 1", "chat one")
        assert set(b.kv_store_usage().owners) == {"chat one"}
        assert b.delete_kv("chat one") == saved.written_bytes
        assert b.kv_store_usage().owners == {} and b.kv_store_usage().total_bytes == 0


async def test_engine_without_store_answers_quietly(tiny_models):
    async with Engine(tiny_models["llama"][0], EngineConfig(kv_pool_tokens=512)) as engine:
        assert engine.save_kv([1, 2, 3], "s").tokens == 0
        assert engine.load_kv([1, 2, 3]).warm_tokens == 0
        assert engine.kv_store_usage() is None
        assert engine.delete_kv("s") == 0


@pytest.mark.real_model
def test_real_model_reloaded_chat_matches_generate(smol, smol_tokenizer, tmp_path):
    loaded, ref = smol
    tok = smol_tokenizer
    messages = [{"role": "user", "content": "Tell me about the moon in two sentences."}]
    first = tok.encode(
        tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    cfg = store_cfg(tmp_path, kv_pool_tokens=4096)
    a = EngineCore(loaded, cfg)
    req = a.make_request(first, SamplingParams(max_tokens=40))
    a.run_until_done([req])
    history = first + req.output_ids
    assert a.kv_tier.save(history, "moon").tokens == len(history) - 1
    follow = tok.encode(
        "\n<|im_start|>user\nAnd the sun?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    turn2 = history + follow
    without_reload = a.make_request(turn2, SamplingParams(max_tokens=30))
    a.run_until_done([without_reload])

    b = EngineCore(loaded, cfg)
    assert b.kv_tier.load(history).loaded_tokens == len(history) - 1
    reloaded = b.make_request(turn2, SamplingParams(max_tokens=30))
    b.run_until_done([reloaded])
    b.check_integrity()
    assert reloaded.cached_tokens == len(history) - 1
    assert reloaded.output_ids == without_reload.output_ids == hf_greedy(ref, turn2, 30, loaded.eos_ids)


def test_a_long_path_loads_group_by_group(tiny_models, tmp_path, monkeypatch):
    import radixchat.engine.kvstore.tier as tier

    loaded, ref = tiny_models["llama"]
    first = rand_ids(40, 400)
    a = EngineCore(loaded, store_cfg(tmp_path))
    history = first + reply(a, first).output_ids
    a.kv_tier.save(history, "s")
    monkeypatch.setattr(tier, "LOAD_GROUP_BYTES", 70_000)  # two 64-token blocks (32 KiB each) a trip
    b = EngineCore(loaded, store_cfg(tmp_path))
    trips = []
    res = b.kv_tier.load(history, lambda fn, *args: trips.append(fn.__name__) or fn(*args))
    assert res.loaded_tokens == len(history) - 1 and res.cached_tokens == 0
    assert trips.count("_apply_load") == 4  # 7 blocks: 2 + 2 + 2 + 1
    b.check_integrity()
    turn = history + rand_ids(41, 5)
    assert reply(b, turn).output_ids == hf_greedy(ref, turn, 12)


async def test_saving_and_loading_while_requests_run_keeps_everything_exact(tiny_models, tmp_path):
    loaded, ref = tiny_models["llama"]
    saved_path, busy = rand_ids(50, 300), rand_ids(51, 200)
    async with Engine(loaded, store_cfg(tmp_path, debug=True)) as engine:
        await engine.generate(saved_path, SamplingParams(max_tokens=1))
        running = engine.submit(busy, SamplingParams(max_tokens=40, ignore_eos=True))
        saved, usage = await asyncio.gather(
            asyncio.to_thread(engine.save_kv, saved_path, "s"), asyncio.to_thread(engine.kv_store_usage)
        )
        assert saved.tokens == 300 and usage is not None
        out = await running.result()
        assert out.token_ids == hf_greedy(ref, busy, 40)
    async with Engine(loaded, store_cfg(tmp_path, debug=True)) as engine:
        running = engine.submit(busy, SamplingParams(max_tokens=40, ignore_eos=True))
        res = await asyncio.to_thread(engine.load_kv, saved_path)
        turn = saved_path + rand_ids(52, 4)
        follow, out = await asyncio.gather(
            engine.generate(turn, SamplingParams(max_tokens=8, ignore_eos=True)), running.result()
        )
        assert res.loaded_tokens == 300 and follow.usage.cached_tokens == 300
        assert follow.token_ids == hf_greedy(ref, turn, 8) and out.token_ids == hf_greedy(ref, busy, 40)
    engine.core.check_integrity()
