"""Number formatting shared by the panels."""

from __future__ import annotations


def human_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def bar(fraction: float, width: int) -> str:
    """A text bar, ``█`` for the used part, ``░`` for the rest."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    return "█" * filled + "░" * (width - filled)


def percent(x: float | None) -> str:
    return "–" if x is None else f"{x:.0%}"
