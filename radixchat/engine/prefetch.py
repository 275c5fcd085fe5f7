"""How far ahead the native decode products prefetch their codes: measured per machine, like the KV pool's dtype.

A decode step streams every weight once, so its products run at the speed memory feeds them. Whether a software
prefetch a few KB ahead of the stream helps the hardware prefetchers is the machine's own answer: it paid on one
CPU and cost on another (docs/benchmarks.md section 12). ``auto`` times each product at one row over ~96 MB of
weights (a small model's layers), for each distance in turn, once per machine (cached beside the weights probe),
and takes a distance only where it beats none by a clear margin. The distance never changes a product's result,
only its speed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from radixchat.machine import cpu_load, trusted_timings, write_probe

log = logging.getLogger(__name__)

#: The native decode products (``kernels/int4.cpp``) that take a distance.
STREAMERS = ("int4_gemv", "int4_dot8", "int8_dot8", "int8_gemv")
DISTANCES = (0, 2048, 4096, 8192)  # bytes ahead; 0: the products' own default
#: A distance is taken only when it is at least this much faster than none.
MARGIN = 0.05
PROBE_BYTES = 96 << 20  # weights each product streams per round
PROBE_ROUNDS = 4
SIGNATURE = "code_prefetch"
_SIDE = 2048  # each probe matrix is _SIDE x _SIDE


def apply_prefetch(
    setting: str | None, cache_dir: Path | None, progress: Callable[[str], None] | None = None
) -> dict[str, int]:
    """Set each decode product's prefetch distance for ``setting`` and return them by product: "auto" measured
    (once per machine, cached), "off" none, None leaves them as they are ({}).

    Only once the native kernels are loaded (the caller checks)."""
    if setting is None:
        return {}
    if setting == "off":
        chosen = dict.fromkeys(STREAMERS, 0)
    else:
        timings = _load_or_probe(cache_dir, progress)
        chosen = {name: choose(timings.get(name, {})) for name in STREAMERS}
    for name, ahead in chosen.items():
        torch.ops.radixchat.set_prefetch(name, ahead)
    return chosen


def choose(timings: dict[str, float]) -> int:
    """The distance ``auto`` takes from one product's probe timings (seconds per round, by distance as text):
    the fastest, if it beats no prefetch (0) by ``MARGIN``; else 0."""
    if "0" not in timings:
        return 0
    best = min(timings, key=timings.__getitem__)
    return int(best) if timings[best] < timings["0"] * (1 - MARGIN) else 0


def _load_or_probe(
    cache_dir: Path | None, progress: Callable[[str], None] | None
) -> dict[str, dict[str, float]]:
    load = cpu_load()
    cached = trusted_timings(cache_dir, SIGNATURE, load)
    if cached is not None:
        return cached
    if progress:
        progress("measuring the decode products' prefetch on this CPU (once)")
    timings = probe()
    if cache_dir is not None:
        chosen = {name: choose(timings[name]) for name in STREAMERS}
        try:
            write_probe(cache_dir, SIGNATURE, {"timings": timings, "auto": chosen, "load": round(load, 2)})
        except OSError as exc:
            log.warning("cannot cache the prefetch probe in %s: %s", cache_dir, exc)
    return timings


def _operands(name: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One _SIDE x _SIDE weight in ``name``'s layout: random codes, small positive scales."""
    n = k = _SIDE
    if name in ("int4_gemv", "int4_dot8"):  # [N*K/2] codes, [K/32][N][1] scales (a Q4_0 file's layout)
        codes = torch.randint(0, 256, (n * k // 2,), generator=gen, dtype=torch.uint8)
        return codes, torch.full((k // 32, n, 1), 0.01, dtype=torch.bfloat16)
    if name == "int8_dot8":  # [N/64][K/4][64][4] codes, [N/64][K/32][2][64] scales and minimums
        codes = torch.randint(0, 256, (n // 64, k // 4, 64, 4), generator=gen, dtype=torch.uint8)
        return codes, torch.full((n // 64, k // 32, 2, 64), 0.01)
    # int8_gemv (Q8_0 heads): [N/64][K][64] codes, [N/64][K/32][64] scales
    codes = torch.randint(-127, 128, (n // 64, k, 64), generator=gen, dtype=torch.int8)
    return codes, torch.full((n // 64, k // 32, 64), 0.01, dtype=torch.float16)


def _round(op, name: str, mats: list, x: torch.Tensor, ahead: int) -> float:  # noqa: ANN001
    """Seconds for one pass of ``op`` over ``mats`` at prefetch distance ``ahead``."""
    torch.ops.radixchat.set_prefetch(name, ahead)
    started = time.perf_counter()
    for codes, scales in mats:
        op(x, codes, scales)
    return time.perf_counter() - started


def probe() -> dict[str, dict[str, float]]:
    """Seconds per round of each product at one row over ``PROBE_BYTES`` of weights, by distance.

    The distances take turns round after round and each keeps its best time, so a burst of other work slows all
    of them alike instead of deciding against the one it hit. Leaves every distance at 0."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, _SIDE, generator=gen)
    out: dict[str, dict[str, float]] = {}
    with torch.inference_mode():
        for name in STREAMERS:
            op = getattr(torch.ops.radixchat, name)
            first = _operands(name, gen)
            per = sum(t.numel() * t.element_size() for t in first)
            mats = [first] + [_operands(name, gen) for _ in range(max(1, PROBE_BYTES // per) - 1)]

            best = {str(d): _round(op, name, mats, x, d) for d in DISTANCES}  # also the warm-up
            for _ in range(PROBE_ROUNDS):
                for d in DISTANCES:
                    best[str(d)] = min(best[str(d)], _round(op, name, mats, x, d))
            torch.ops.radixchat.set_prefetch(name, 0)
            out[name] = best
    return out
