"""Workload 4: constrained JSON. Mask latency (ours vs xgrammar, same schemas, same token sequences),
schema compile time, and end-to-end tokens/s of JSON mode versus unconstrained decoding through the
engine on the same prompts and the same number of tokens.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
import warnings

import torch

from bench.common import Models, Report, isolated, median, pct
from bench.grammar_bench import WORKLOAD, compile_times
from radixchat.chat.backend import grammar_for
from radixchat.chat.local import LocalBackend
from radixchat.chat.modes import ConstraintSpec
from radixchat.engine import Engine, EngineConfig, SamplingParams
from radixchat.grammar import TokenizerInfo, compile_grammar, compile_json_schema

DOCS_PER_SCHEMA = 40


def _documents(tok) -> list[tuple[str, dict | None, list[list[int]]]]:
    rng = random.Random(0)
    out = []
    for name, schema, gen in WORKLOAD:
        docs = []
        for _ in range(2 * DOCS_PER_SCHEMA):
            text = json.dumps(gen(rng), ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, None, 2]))
            docs.append(tok.encode(text, add_special_tokens=False))
        out.append((name, schema, docs))
    return out


def _ours(info, workload) -> list[float]:
    lat = []
    for _name, schema, docs in workload:
        g = compile_grammar("json", info) if schema is None else compile_json_schema(schema, info)
        for i, ids in enumerate(docs):
            m = g.matcher()
            for tid in [*ids, info.eos_ids[0]]:
                t0 = time.perf_counter()
                m.allowed()
                dt = time.perf_counter() - t0
                if i >= DOCS_PER_SCHEMA:  # the first half warms the caches
                    lat.append(dt * 1e6)
                m.advance(tid)
    return lat


def _xgrammar(tok, vocab_size, workload) -> list[float] | str:
    try:
        import xgrammar as xgr
    except ImportError:
        return "xgrammar is not installed (pip install xgrammar)"
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size)
    compiler = xgr.GrammarCompiler(info)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    lat = []
    for _name, schema, docs in workload:
        cg = (
            compiler.compile_builtin_json_grammar()
            if schema is None
            else compiler.compile_json_schema(json.dumps(schema))
        )
        for i, ids in enumerate(docs):
            m = xgr.GrammarMatcher(cg)
            for tid in ids:
                t0 = time.perf_counter()
                m.fill_next_token_bitmask(bitmask)
                dt = time.perf_counter() - t0
                if i >= DOCS_PER_SCHEMA:
                    lat.append(dt * 1e6)
                if not m.accept_token(tid):
                    break  # a document xgrammar's JSON reading refuses (e.g. its whitespace rules)
    return lat


async def _e2e(models: Models, concurrency: int, rounds: int) -> tuple[float, float, float]:
    """Median tok/s of JSON mode and of unconstrained replies of the same lengths, and the median of the
    rounds' ratios: each round pairs the two back to back, the first of them alternating, so that the
    other load on a shared machine (which moves by more than the grammar costs) falls on both alike."""
    engine = Engine(models.loaded, EngineConfig(kv_pool_tokens=16384))
    schema = WORKLOAD[0][1]
    async with engine:
        backend = LocalBackend(engine)
        prompts = []
        for i in range(concurrency):
            conv = backend.new_conversation()
            conv.add_user(f"Describe person number {i} as JSON with name, age and tags.")
            prompts.append(conv.ids)

        async def constrained() -> tuple[float, list[int]]:
            grammars = [grammar_for(backend, ConstraintSpec("json", schema)) for _ in prompts]
            t0 = time.perf_counter()
            res = await asyncio.gather(
                *(engine.generate(p, SamplingParams(max_tokens=64), g) for p, g in zip(prompts, grammars))
            )
            return sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0), [
                len(r.token_ids) for r in res
            ]

        async def unconstrained(lengths: list[int]) -> float:
            t0 = time.perf_counter()
            res = await asyncio.gather(
                *(
                    engine.generate(p, SamplingParams(max_tokens=n, ignore_eos=True))
                    for p, n in zip(prompts, lengths)
                )
            )
            return sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0)

        _, lengths = await constrained()  # warm-up: the prompts' prefill and the grammar's first masks
        con, unc = [], []
        for k in range(rounds):
            if k % 2:
                unc.append(await unconstrained(lengths))
                c, lengths = await constrained()
                con.append(c)
            else:
                c, lengths = await constrained()
                con.append(c)
                unc.append(await unconstrained(lengths))
    return median(con), median(unc), median([c / u for c, u in zip(con, unc)])


def _masks(models: Models):
    tok = models.tokenizer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        info = TokenizerInfo.from_tokenizer(
            tok, vocab_size=models.loaded.vocab_size, eos_ids=sorted(models.loaded.eos_ids)
        )
        workload = _documents(tok)
        return (
            _ours(info, workload),
            _xgrammar(tok, models.loaded.vocab_size, workload),
            compile_times(info, 12),
        )
    finally:
        torch.set_num_threads(threads)


def run(models: Models, repeats: int = 3) -> list[Report]:
    warnings.filterwarnings("ignore")
    ours, xg, comp = isolated(_masks, models)
    masks = Report(
        "JSON masks: latency per step after warm-up (us), same schemas and token sequences, one thread"
    )
    for name, lat in [("radixchat.grammar", ours), ("xgrammar", xg)]:
        if isinstance(lat, str):
            masks.row(
                matcher=name,
                steps=0,
                p50=float("nan"),
                p90=float("nan"),
                p99=float("nan"),
                mean=float("nan"),
                max=float("nan"),
                note=lat,
            )
            continue
        masks.row(
            matcher=name,
            steps=len(lat),
            p50=pct(lat, 50),
            p90=pct(lat, 90),
            p99=pct(lat, 99),
            mean=statistics.fmean(lat),
            max=max(lat),
            note="",
        )
    masks.summary = {
        "our mask p99 (target <= 1000 us)": pct(ours, 99),
        "schema compile to first mask p50 ms (target <= 200)": comp["p50_ms"],
        "first schema in a fresh process ms": comp["first_ms"],
    }
    e2e = Report(
        "JSON mode vs unconstrained through the engine (tokens/s, same prompts and token counts; ratio: "
        "the median of the rounds' paired ratios)"
    )
    for conc in (1, 8):
        c, u, ratio = asyncio.run(_e2e(models, conc, repeats))
        e2e.row(streams=conc, json_mode=c, unconstrained=u, ratio=ratio)
    e2e.summary = {
        "JSON mode / unconstrained, 1 stream (target >= 0.95)": e2e.rows[0]["ratio"],
        "JSON mode / unconstrained, 8 streams": e2e.rows[1]["ratio"],
    }
    return [masks, e2e]
