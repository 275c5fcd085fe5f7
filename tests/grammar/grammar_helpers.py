"""Shared helpers for the grammar tests: brute-force masks, random tokenizations, random walks."""

from __future__ import annotations

import json
import random

import numpy as np

from radixchat.grammar import GrammarError, TokenizerInfo


def brute_mask(m, info: TokenizerInfo) -> np.ndarray:
    """The mask by trying every token from the matcher's state (scalar path, no caches)."""
    g = m.grammar
    out = np.zeros(info.vocab_size, dtype=bool)
    for tid in range(len(info.token_bytes)):
        data = g.token_bytes(tid)
        if data is not None and any(g.feed(st, lx, data) for st, lx in m.configs):
            out[tid] = True
    if m.is_accepting():
        out[list(info.eos_ids)] = True
    return out


def _token_index(info: TokenizerInfo) -> dict[bytes, list[int]]:
    idx = info.__dict__.get("_test_index")
    if idx is None:
        idx = {}
        for tid, b in enumerate(info.token_bytes):
            if b is not None:
                idx.setdefault(b, []).append(tid)
        info.__dict__["_test_index"] = idx
    return idx


def random_split(data: bytes, info: TokenizerInfo, rng: random.Random) -> list[int]:
    """A random (non-canonical) tokenization of ``data`` into vocabulary tokens."""
    idx = _token_index(info)
    n = len(data)
    reach = [False] * (n + 1)  # reach[i]: data[i:] can be tokenized
    reach[n] = True
    maxlen = info.max_token_bytes
    for i in range(n - 1, -1, -1):
        reach[i] = any(reach[j] and data[i:j] in idx for j in range(i + 1, min(n, i + maxlen) + 1))
    if not reach[0]:
        raise ValueError(f"cannot tokenize {data!r}")
    out, i = [], 0
    while i < n:
        choices = [j for j in range(i + 1, min(n, i + maxlen) + 1) if reach[j] and data[i:j] in idx]
        j = rng.choice(choices)
        out.append(rng.choice(idx[data[i:j]]))
        i = j
    return out


def tokenizations(text: str, tokenizer, info: TokenizerInfo, rng: random.Random, n_random: int = 2):
    """The canonical tokenization plus ``n_random`` random splits."""
    yield tokenizer.encode(text, add_special_tokens=False)
    for _ in range(n_random):
        yield random_split(text.encode(), info, rng)


def first_rejection(g, ids: list[int]) -> int | None:
    """Index of the first token the grammar masks (len(ids) if the end is not accepting), or None."""
    m = g.matcher()
    for k, tid in enumerate(ids):
        if not m.allowed()[tid]:
            return k
        m.advance(tid)
    return None if m.is_accepting() else len(ids)


def walk(g, info: TokenizerInfo, rng: random.Random, budget: int, bias: list[int] | None = None):
    """Sample uniformly among allowed tokens (optionally preferring ``bias`` tokens) under a token
    budget. Returns (ids, text bytes, finished with EOS)."""
    m = g.matcher()
    ids: list[int] = []
    out = b""
    for step in range(budget):
        mask = m.allowed(budget - step).numpy()
        allowed = np.flatnonzero(mask)
        assert allowed.size, "all-False mask"
        pick = None
        if bias is not None:
            preferred = [t for t in bias if mask[t]]
            if preferred and rng.random() < 0.7:
                pick = rng.choice(preferred)
        tid = int(pick if pick is not None else rng.choice(allowed.tolist()))
        m.advance(tid)
        ids.append(tid)
        if tid in info.eos_ids:
            return ids, out, True
        out += g.token_bytes(tid)
    return ids, out, False


def dumps_variants(value) -> list[str]:
    """Several valid serialisations of one JSON value."""
    return list(
        dict.fromkeys(
            [
                json.dumps(value, separators=(",", ":"), ensure_ascii=False),
                json.dumps(value, ensure_ascii=False),
                json.dumps(value),
                json.dumps(value, indent=2, ensure_ascii=False),
            ]
        )
    )


__all__ = [
    "GrammarError",
    "brute_mask",
    "dumps_variants",
    "first_rejection",
    "random_split",
    "tokenizations",
    "walk",
]
