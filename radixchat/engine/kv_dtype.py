"""The KV pool's dtype: what the pool holds K/V in, chosen per machine like the weights' format.

A decode step reads every cached token's K/V once per layer, so past a few thousand tokens of history the
pool's bytes, not the weights, decide its speed. A half-precision pool halves them. ``float32`` (with float32
weights) is the exact path the equality tests use; ``auto`` measures decode attention over a long context in
each dtype on this machine, once (cached beside the weights probe), and takes the fastest — a narrower dtype
only when it wins by a clear margin, and float16 (10 mantissa bits) over bfloat16 (7) unless bfloat16 wins
clearly. A probe measured again (the first was taken on a busy machine) changes the choice only where the new
one wins by that margin too, and a deterministic start never measures again: the pool's dtype is part of its
reply. Both keep the real model's predictions (``tests/engine/test_kv_dtype.py``: the quality guard).
On CUDA ``auto`` is the model's dtype.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixchat.errors import ConfigError
from radixchat.machine import cached_probe, cpu_load, trusted_timings, write_probe

log = logging.getLogger(__name__)

KV_DTYPES = ("auto", "float32", "bfloat16", "float16")
# Most precise first: a near tie goes to the earlier one.
PROBED = ("float32", "float16", "bfloat16")
#: A narrower dtype is chosen only when decode attention is at least this much faster with it.
MARGIN = 0.10
PROBE_CONTEXT = 4096  # keys per sequence in the probe
PROBE_BYTES = 96 << 20  # float32 K/V the probe streams per round: more than any last-level cache
PROBE_ROUNDS = 5


def check_kv_dtype(setting: str) -> None:
    if setting not in KV_DTYPES:
        raise ConfigError(f"unknown kv_dtype '{setting}' (choose one of: {', '.join(KV_DTYPES)})")


def resolve_kv_dtype(
    setting: str | None,
    model_dtype: torch.dtype,
    device: torch.device,
    shape: tuple[int, int, int],
    cache_dir: Path | None,
    progress: Callable[[str], None] | None = None,
    hold: bool = False,
) -> torch.dtype:
    """The pool dtype for ``setting`` (None: the model's dtype). ``shape``: (query heads, kv heads, head_dim).
    ``hold``: a cached probe is used however busy the machine was when it was taken (``trusted_timings``)."""
    if setting is None:
        return model_dtype
    check_kv_dtype(setting)
    if setting != "auto":
        return getattr(torch, setting)
    if device.type != "cpu" or model_dtype != torch.float32:
        return model_dtype
    return getattr(torch, _load_or_probe(shape, cache_dir, progress, hold))


def choose(timings: dict[str, float], held: str | None = None) -> str:
    """The dtype ``auto`` takes from the probe's timings (seconds per round, by dtype name); ``held``: the one an
    earlier probe took, which stands unless the new winner is faster than it by the margin."""
    best = "float32"
    for name in PROBED[1:]:
        if name in timings and timings[name] < timings[best] * (1 - MARGIN):
            best = name
    if held in timings and best != held and timings[best] >= timings[held] * (1 - MARGIN):
        return held
    return best


def _signature(shape: tuple[int, int, int]) -> str:
    hq, hkv, d = shape
    return f"kv_dtype:{hq}x{hkv}x{d}"


def _load_or_probe(
    shape: tuple[int, int, int],
    cache_dir: Path | None,
    progress: Callable[[str], None] | None,
    hold: bool,
) -> str:
    signature = _signature(shape)
    load = cpu_load()
    held = (cached_probe(cache_dir, signature) or {}).get("auto")
    held = held if held in PROBED else None
    cached = trusted_timings(cache_dir, signature, load, hold)
    if cached is not None:
        return held or choose(cached)
    if progress:
        progress("measuring the KV pool's dtypes on this CPU (once)")
    timings = probe(shape)
    chosen = choose(timings, held)
    if cache_dir is not None:
        try:
            write_probe(cache_dir, signature, {"timings": timings, "auto": chosen, "load": round(load, 2)})
        except OSError as exc:
            log.warning("cannot cache the KV dtype probe in %s: %s", cache_dir, exc)
    return chosen


def probe(shape: tuple[int, int, int]) -> dict[str, float]:
    """Seconds per round of one decode step's attention at ``PROBE_CONTEXT`` keys, by pool dtype.

    Each round reads as many layers' pools as hold ``PROBE_BYTES`` in float32, so the K/V stream from memory
    as in a real step. The dtypes take turns round after round and each keeps its best time, so a burst of
    other work slows all of them alike instead of deciding against the one it hit."""
    from radixchat.engine.attention import decode_attention, paged_decode_usable

    hq, hkv, d = shape
    paged = paged_decode_usable(d, torch.device("cpu"))
    per_layer = 2 * PROBE_CONTEXT * hkv * d * 4
    layers = max(1, PROBE_BYTES // per_layer)
    slots = torch.arange(1, PROBE_CONTEXT + 1, dtype=torch.int64)[None]
    lens = torch.tensor([PROBE_CONTEXT])
    q = torch.randn(1, hq, d)
    pools = {}
    for name in PROBED:
        dtype = getattr(torch, name)
        pools[name] = [
            (
                torch.randn(PROBE_CONTEXT + 1, hkv, d).to(dtype),
                torch.randn(PROBE_CONTEXT + 1, hkv, d).to(dtype),
            )
            for _ in range(layers)
        ]

    def once(name: str) -> float:
        started = time.perf_counter()
        for k, v in pools[name]:
            decode_attention(q, k, v, slots, lens, None, None, paged=paged)
        return time.perf_counter() - started

    with torch.inference_mode():
        best = {name: once(name) for name in PROBED}  # also the warm-up
        for _ in range(PROBE_ROUNDS):
            for name in PROBED:
                best[name] = min(best[name], once(name))
    return best
