"""Workload 2: shared-prefix fan-out (RAG). One ~1500-token document, 16 different questions, 8 at a time.

Peers, in one process: radixchat (max 8 running); sequential generate(); static-batch generate() (left
padded, batches of 8); transformers continuous batching (``generate_batch``, which has its own
block-level prefix sharing). Throughput = generated tokens / wall time of the whole workload.
"""

from __future__ import annotations

import asyncio
import time
import warnings

import torch

from bench.common import FirstTokenStreamer, Models, Report, hf_generate, isolated, long_text, median, pct
from radixchat.engine import Engine, EngineConfig, SamplingParams

QUESTIONS = [
    "What does rule 3 say?",
    "Summarise rule 7.",
    "Which rules mention catalogues?",
    "Is rule 12 strict?",
    "What is the first rule about?",
    "List two rules about answers.",
    "How many rules are there?",
    "What should the assistant cite?",
    "Which rule is the longest?",
    "Are the rules consistent?",
    "What is the tone of the rules?",
    "Who are the rules for?",
    "What does rule 20 add?",
    "Is there a rule about detail?",
    "Give one rule verbatim.",
    "What would you change?",
]
NEW_TOKENS = 24


def prompts_for(models: Models, doc: str) -> list[list[int]]:
    tok = models.tokenizer
    out = []
    for q in QUESTIONS:
        text = tok.apply_chat_template(
            [
                {"role": "system", "content": "Answer from the document.\n\n" + doc},
                {"role": "user", "content": q},
            ],
            add_generation_prompt=True,
            tokenize=False,
        )
        out.append(tok.encode(text, add_special_tokens=False))
    return out


async def _radix(models: Models, prompts: list[list[int]]) -> dict:
    engine = Engine(models.loaded, EngineConfig(kv_pool_tokens=16384, max_running_requests=8))
    async with engine:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)) for p in prompts)
        )
        wall = time.perf_counter() - t0
        stats = engine.stats(tree=False)
    ttfts = [r.ttft_s * 1000 for r in results]
    return dict(wall=wall, tokens=sum(len(r.token_ids) for r in results), ttfts=ttfts, hit=stats.hit_rate)


def _sequential(models: Models, prompts: list[list[int]]) -> dict:
    """All requests arrive at t0; each waits for the ones before it (TTFT includes that wait)."""
    t0 = time.perf_counter()
    ttfts, tokens = [], 0
    for p in prompts:
        started = time.perf_counter()
        ids, ttft, _ = hf_generate(models.ref, p, NEW_TOKENS)
        ttfts.append((started - t0 + ttft) * 1000)
        tokens += len(ids)
    return dict(wall=time.perf_counter() - t0, tokens=tokens, ttfts=ttfts, hit=0.0)


def _static(models: Models, prompts: list[list[int]]) -> dict:
    """Left-padded batches of 8; a request's first token comes with its whole group's."""
    ref = models.ref
    t0 = time.perf_counter()
    tokens, ttfts = 0, []
    for i in range(0, len(prompts), 8):
        group = prompts[i : i + 8]
        width = max(len(p) for p in group)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
        streamer = FirstTokenStreamer()
        out = ref.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            temperature=None,
            top_p=None,
            top_k=None,
            streamer=streamer,
        )
        ttfts += [(streamer.first - t0) * 1000] * len(group)
        tokens += (out.shape[1] - width) * len(group)
    return dict(wall=time.perf_counter() - t0, tokens=tokens, ttfts=ttfts, hit=0.0)


def _generate_batch(models: Models, prompts: list[list[int]]) -> dict:
    from transformers import GenerationConfig

    ref = models.ref
    cfg = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    t0 = time.perf_counter()
    out = ref.generate_batch(prompts, generation_config=cfg, record_timestamps=True, warmup=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.generated_tokens) for o in out.values())
    ttfts = []
    for o in out.values():
        stamps = getattr(o, "timestamps", None) or []
        created = getattr(o, "created_time", None)
        if stamps and created is not None:
            ttfts.append((stamps[0] - created) * 1000)
    return dict(wall=wall, tokens=tokens, ttfts=ttfts, hit=float("nan"))


def run(models: Models, repeats: int = 3) -> list[Report]:
    warnings.filterwarnings("ignore")
    doc = long_text(models.tokenizer, 1500)
    prompts = prompts_for(models, doc)
    peers = {
        "radixchat": lambda: asyncio.run(_radix(models, prompts)),
        "generate_sequential": lambda: isolated(_sequential, models, prompts),
        "generate_static_batch8": lambda: isolated(_static, models, prompts),
        "generate_batch (transformers CB)": lambda: isolated(_generate_batch, models, prompts),
    }
    results: dict[str, list[dict]] = {k: [] for k in peers}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for name, fn in peers.items():  # interleaved: each repeat runs every peer once
            if name in errors:
                continue
            try:
                results[name].append(fn())
            except Exception as exc:  # a peer that cannot run here is reported, not fatal
                errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    report = Report(
        f"RAG fan-out: {len(prompts[0])}-token prompts sharing a document, 16 questions, 8 at a time"
    )
    base = median([r["tokens"] / r["wall"] for r in results["radixchat"]])
    for name, rs in results.items():
        if not rs:
            report.row(
                peer=name,
                tokens_per_s=float("nan"),
                radix_speedup=float("nan"),
                ttft_p50_ms=float("nan"),
                ttft_p99_ms=float("nan"),
                hit_rate=float("nan"),
                note=errors.get(name, ""),
            )
            continue
        tps = median([r["tokens"] / r["wall"] for r in rs])
        all_ttft = [t for r in rs for t in r["ttfts"]]
        report.row(
            peer=name,
            tokens_per_s=tps,
            radix_speedup=base / tps,
            ttft_p50_ms=pct(all_ttft, 50),
            ttft_p99_ms=pct(all_ttft, 99),
            hit_rate=median([r["hit"] for r in rs]),
            note=errors.get(name, ""),
        )
    cb = results["generate_batch (transformers CB)"]
    seq = median([r["tokens"] / r["wall"] for r in results["generate_sequential"]])
    report.summary = {
        "radixchat / generate_batch throughput (target >= 3)": (
            base / median([r["tokens"] / r["wall"] for r in cb])
            if cb
            else "could not run: " + errors.get("generate_batch (transformers CB)", "?")
        ),
        "radixchat / sequential generate throughput": base / seq,
    }
    return [report]
