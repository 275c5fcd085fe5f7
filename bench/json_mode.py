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


async def _e2e(models: Models, concurrency: int, rounds: int) -> tuple[float, float]:
    engine = Engine(models.loaded, EngineConfig(kv_pool_tokens=16384))
    schema = WORKLOAD[0][1]
    async with engine:
        backend = LocalBackend(engine)
        prompts = []
        for i in range(concurrency):
            conv = backend.new_conversation()
            conv.add_user(f"Describe person number {i} as JSON with name, age and tags.")
            prompts.append(conv.ids)
        con, unc = [], []
        for _ in range(rounds):
            grammars = [grammar_for(backend, ConstraintSpec("json", schema)) for _ in prompts]
            t0 = time.perf_counter()
            cres = await asyncio.gather(
                *(engine.generate(p, SamplingParams(max_tokens=64), g) for p, g in zip(prompts, grammars))
            )
            con.append(sum(len(r.token_ids) for r in cres) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            ures = await asyncio.gather(
                *(
                    engine.generate(p, SamplingParams(max_tokens=len(r.token_ids), ignore_eos=True))
                    for p, r in zip(prompts, cres)
                )
            )
            unc.append(sum(len(r.token_ids) for r in ures) / (time.perf_counter() - t0))
    return median(con), median(unc)


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
    e2e = Report("JSON mode vs unconstrained through the engine (tokens/s, same prompts and token counts)")
    for conc in (1, 8):
        c, u = asyncio.run(_e2e(models, conc, repeats))
        e2e.row(streams=conc, json_mode=c, unconstrained=u, ratio=c / u)
    e2e.summary = {
        "JSON mode / unconstrained, 1 stream (target >= 0.95)": e2e.rows[0]["ratio"],
        "JSON mode / unconstrained, 8 streams": e2e.rows[1]["ratio"],
    }
    return [masks, e2e]
