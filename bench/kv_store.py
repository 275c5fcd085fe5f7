"""Workload 6: the KV store on disk.

- **Reopen**: a ~2,000-token saved chat session is reopened in a fresh engine (new pool, empty tree, as
  after restarting the app) and continued with one new user turn. TTFT of that first reply with its KV
  loaded from disk (on admission, as a batch continuation does; and after an explicit ``load_kv``, as the
  chat app does while the user types) vs a cold prefill of the whole history. Greedy tokens must match.
- **Disk**: bytes per token on disk; save and load time per 1,000 tokens (the files are in the OS page
  cache after the save, as they are when a session is reopened soon after; a cold disk adds its read
  time).
- **Spill**: the many-conversations workload (8 x 4 turns) with a pool small enough to force eviction,
  with evicted KV spilled to the store and loaded back on a hit vs recomputed.

Every store lives in a temporary directory.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import warnings
from pathlib import Path

from bench.common import Models, Report, long_text, median
from bench.conversations import _radix
from radixchat.engine import Engine, EngineConfig, SamplingParams

HISTORY_TOKENS = 2000
NEW_TOKENS = 16
POOL = 16384
SPILL_POOLS = (1100, 800)  # the default pool of the conversations workload is 16384: no eviction


def _session_ids(models: Models) -> tuple[list[int], list[int]]:
    """(a ~2,000-token chat history, the history plus one new user turn and the generation prompt)."""
    tok = models.tokenizer
    messages = [{"role": "system", "content": long_text(tok, 300)}]
    i = 0
    while True:
        i += 1
        messages.append({"role": "user", "content": f"Question {i}: " + long_text(tok, 120)})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + long_text(tok, 150)})
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) >= HISTORY_TOKENS:
            break
    follow = tok.encode(
        "<|im_start|>user\nSo which rule matters most?<|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )
    return ids, ids + follow


async def _first_reply(
    models: Models, cfg: EngineConfig, history: list[int], prompt: list[int], explicit: bool
) -> dict:
    async with Engine(models.loaded, cfg) as engine:
        load_s = loaded = 0
        if explicit:
            t0 = time.perf_counter()
            res = await asyncio.to_thread(engine.load_kv, history)
            load_s, loaded = time.perf_counter() - t0, res.loaded_tokens
        out = await engine.generate(prompt, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))
        loaded = loaded or engine.stats(tree=False).kv_loaded_tokens
    return dict(
        ttft=out.ttft_s, ids=out.token_ids, cached=out.usage.cached_tokens, loaded=loaded, load_s=load_s
    )


async def _save(models: Models, cfg: EngineConfig, history: list[int]) -> dict:
    async with Engine(models.loaded, cfg) as engine:
        await engine.generate(history, SamplingParams(max_tokens=1))
        t0 = time.perf_counter()
        res = await asyncio.to_thread(engine.save_kv, history, "bench")
        save_s = time.perf_counter() - t0
        usage = engine.kv_store_usage()
    assert res.notice is None, res.notice
    return dict(tokens=res.tokens, bytes=usage.total_bytes, save_s=save_s)


def _reopen(models: Models, repeats: int) -> list[Report]:
    history, prompt = _session_ids(models)
    rows: dict[str, list[dict]] = {
        "cold prefill": [],
        "warm, loaded on admission": [],
        "warm, load_kv first": [],
    }
    saves = []
    cold_cfg = EngineConfig(kv_pool_tokens=POOL)
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:  # a new store each time: the save writes every block
            cfg = EngineConfig(kv_pool_tokens=POOL, kv_store_dir=Path(tmp))
            saves.append(asyncio.run(_save(models, cfg, history)))
            rows["cold prefill"].append(asyncio.run(_first_reply(models, cold_cfg, history, prompt, False)))
            rows["warm, loaded on admission"].append(
                asyncio.run(_first_reply(models, cfg, history, prompt, False))
            )
            rows["warm, load_kv first"].append(asyncio.run(_first_reply(models, cfg, history, prompt, True)))
    cold = median([r["ttft"] for r in rows["cold prefill"]])
    reference = rows["cold prefill"][0]["ids"]
    report = Report(f"reopening a {len(history)}-token session: first-turn TTFT (fresh engine)")
    for name, rs in rows.items():
        ttft = median([r["ttft"] for r in rs])
        report.row(
            variant=name,
            ttft_ms=ttft * 1000,
            cold_over_this=cold / ttft,
            cached_tokens=median([r["cached"] for r in rs]),
            loaded_from_disk=median([r["loaded"] for r in rs]),
            same_tokens=all(r["ids"] == reference for r in rs),
        )
    tokens = saves[0]["tokens"]
    explicit = rows["warm, load_kv first"]
    report.summary = {
        "cold / warm TTFT (loaded on admission)": cold
        / median([r["ttft"] for r in rows["warm, loaded on admission"]]),
        "disk bytes per token": saves[0]["bytes"] / tokens,
        "pool bytes per token": models.loaded.num_layers
        * 2
        * models.loaded.num_kv_heads
        * models.loaded.head_dim
        * models.loaded.dtype.itemsize,
        "save ms per 1,000 tokens (first save, fsync)": median([s["save_s"] for s in saves]) / tokens * 1e6,
        "load ms per 1,000 tokens (load_kv)": median([r["load_s"] / r["loaded"] for r in explicit]) * 1e6,
    }
    return [report]


def _spill(models: Models, repeats: int) -> list[Report]:
    system = long_text(models.tokenizer, 300)
    variants = [(pool, spill) for pool in SPILL_POOLS for spill in (False, True)]
    results: dict[tuple[int, bool], list[dict]] = {v: [] for v in variants}
    for _ in range(repeats):  # interleaved, so load on a shared machine hits every variant alike
        for pool, spill in variants:
            with tempfile.TemporaryDirectory() as tmp:
                cfg = EngineConfig(
                    kv_pool_tokens=pool, max_running_requests=16, kv_store_dir=Path(tmp), kv_spill=spill
                )
                results[pool, spill].append(asyncio.run(_radix(models, system, cfg)))
    report = Report("spill on eviction: many conversations (8 x 4 turns), pools that force eviction")
    for (pool, spill), rs in results.items():
        base = results[pool, False]
        tps = median([r["tokens"] / r["wall"] for r in rs])
        forward = median([r["forward_s"] for r in rs])
        disk = median([r["disk_s"] for r in rs])
        report.row(
            variant=f"pool {pool}, {'spill to disk' if spill else 'recompute'}",
            tokens_per_s=tps,
            vs_recompute=tps / median([r["tokens"] / r["wall"] for r in base]),
            hit_rate=median([r["hit"] for r in rs]),
            prefilled=median([r["prefilled"] for r in rs]),
            evicted=median([r["evicted"] for r in rs]),
            spilled=median([r["spilled"] for r in rs]),
            loaded=median([r["loaded"] for r in rs]),
            forward_s=forward,
            disk_s=disk,
            forward_plus_disk_vs_recompute=(forward + disk) / median([r["forward_s"] for r in base]),
        )
    return [report]


def run(models: Models, repeats: int = 3) -> list[Report]:
    warnings.filterwarnings("ignore")
    return _reopen(models, repeats) + _spill(models, repeats)
