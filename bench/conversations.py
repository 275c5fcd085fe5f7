"""Workload 3: many conversations — 8 conversations x 4 turns, interleaved (the ``--batch`` path) — and
workload 5: ablations on the same workload (radix cache off, LPM vs FCFS, chunked-prefill sizes, pool
sizes that force eviction).
"""

from __future__ import annotations

import asyncio
import time
import warnings

from bench.common import Models, Report, hf_generate, isolated, long_text, median
from radixchat.chat.local import LocalBackend
from radixchat.engine import Engine, EngineConfig, SamplingParams

TOPICS = ["rivers", "bread", "comets", "chess", "bees", "glass", "tides", "maps"]
TURNS = ["Tell me one fact about {t}.", "Why is that?", "Give an example.", "Summarise in five words."]
NEW_TOKENS = 24


async def _radix(models: Models, system: str, cfg: EngineConfig) -> dict:
    engine = Engine(models.loaded, cfg)
    async with engine:
        backend = LocalBackend(engine)
        t0 = time.perf_counter()

        async def conversation(topic: str) -> int:
            conv = backend.new_conversation(system=system)
            n = 0
            for turn in TURNS:
                conv.add_user(turn.format(t=topic))
                result = await backend.reply(
                    conv, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
                ).result()
                n += result.completion_tokens
            return n

        tokens = sum(await asyncio.gather(*(conversation(t) for t in TOPICS)))
        wall = time.perf_counter() - t0
        st = engine.stats(tree=False)
        core = engine.core
    return dict(
        wall=wall,
        tokens=tokens,
        hit=st.hit_rate,
        prefilled=st.prompt_tokens - st.cached_tokens,
        retractions=st.retractions,
        evicted=st.evicted_tokens,
        spilled=st.kv_spilled_tokens,
        loaded=st.kv_loaded_tokens,
        disk_s=core.kv_tier.step_disk_s if core.kv_tier is not None else 0.0,
        forward_s=core.forward_s,
        overhead=1 - core.forward_s / core.step_s if core.step_s else float("nan"),
    )


def _generate_full_history(models: Models, system: str) -> dict:
    """What a hand-written loop does: re-run generate() on the whole history, one conversation at a time."""
    tok = models.tokenizer
    t0 = time.perf_counter()
    tokens = prefilled = 0
    for topic in TOPICS:
        messages = [{"role": "system", "content": system}]
        for turn in TURNS:
            messages.append({"role": "user", "content": turn.format(t=topic)})
            ids = tok.encode(
                tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            )
            out, _, _ = hf_generate(models.ref, ids, NEW_TOKENS)
            prefilled += len(ids)
            tokens += len(out)
            messages.append({"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)})
    return dict(
        wall=time.perf_counter() - t0,
        tokens=tokens,
        hit=0.0,
        prefilled=prefilled,
        retractions=0,
        evicted=0,
        spilled=0,
        loaded=0,
        disk_s=0.0,
        forward_s=float("nan"),
        overhead=float("nan"),
    )


def _table(name: str, results: dict[str, list[dict]], base_key: str) -> Report:
    report = Report(name)
    base = median([r["tokens"] / r["wall"] for r in results[base_key]])
    for key, rs in results.items():
        tps = median([r["tokens"] / r["wall"] for r in rs])
        report.row(
            variant=key,
            tokens_per_s=tps,
            vs_base=tps / base,
            hit_rate=median([r["hit"] for r in rs]),
            prefilled=median([r["prefilled"] for r in rs]),
            retractions=median([r["retractions"] for r in rs]),
            evicted=median([r["evicted"] for r in rs]),
            step_overhead=median([r["overhead"] for r in rs]),
        )
    return report


def run(models: Models, repeats: int = 3) -> list[Report]:
    warnings.filterwarnings("ignore")
    system = long_text(models.tokenizer, 300)
    base_cfg = dict(kv_pool_tokens=16384, max_running_requests=16)
    main = {
        "radixchat": lambda: asyncio.run(_radix(models, system, EngineConfig(**base_cfg))),
        "radixchat, radix cache off": lambda: asyncio.run(
            _radix(models, system, EngineConfig(**base_cfg, radix_cache=False))
        ),
        "generate, full history, sequential": lambda: isolated(_generate_full_history, models, system),
    }
    ablations = {
        "lpm, chunk 512, pool 16384 (default)": EngineConfig(**base_cfg),
        "fcfs": EngineConfig(**base_cfg, schedule_policy="fcfs"),
        "chunk 64": EngineConfig(**base_cfg, chunked_prefill_size=64),
        "chunk 2048": EngineConfig(**base_cfg, chunked_prefill_size=2048),
        "pool 1100 (forces eviction)": EngineConfig(kv_pool_tokens=1100, max_running_requests=16),
        "pool 560 (forces retraction)": EngineConfig(kv_pool_tokens=560, max_running_requests=16),
    }
    res_main: dict[str, list[dict]] = {k: [] for k in main}
    res_abl: dict[str, list[dict]] = {k: [] for k in ablations}
    for _ in range(repeats):
        for key, fn in main.items():
            res_main[key].append(fn())
        for key, cfg in ablations.items():
            res_abl[key].append(asyncio.run(_radix(models, system, cfg)))
    r1 = _table("many conversations: 8 x 4 turns, interleaved", res_main, "radixchat")
    r1.summary = {"radixchat / full-history generate throughput": 1 / r1.rows[2]["vs_base"]}
    r2 = _table(
        "ablations on the many-conversations workload", res_abl, "lpm, chunk 512, pool 16384 (default)"
    )
    return [r1, r2]
