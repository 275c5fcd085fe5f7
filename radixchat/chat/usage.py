"""A reply's usage in words (its footer), and usage totals over all replies of a backend.

Torch-free: the app, batch mode and session export all use it, whatever backend produced the numbers.
A remote server may report no prompt or cached tokens: those are None (unknown), never 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def usage_footer(
    prompt: int | None,
    cached: int | None,
    ttft_ms: float | None,
    tokens_per_s: float | None,
    thinking: int | None = None,
    completion: int | None = None,
) -> str:
    """A reply's footer: ``reused 812 · prefilled 15 · TTFT 95 ms · 31 tok/s`` (``prompt 827 · ...`` when
    a remote server reports no cached tokens; no counts when it reports no usage: unknown is not 0). A
    reply that thought counts its thinking tokens apart from its answer's: ``thinking 120 · answer 31``."""
    parts = []
    if prompt is not None and cached is not None:
        parts += [f"reused {cached}", f"prefilled {prompt - cached}"]
    elif prompt is not None:
        parts.append(f"prompt {prompt}")
    if thinking is not None:
        parts.append(f"thinking {thinking}")
        if completion is not None:
            parts.append(f"answer {max(completion - thinking, 0)}")
    if ttft_ms is not None:
        parts.append(f"TTFT {ttft_ms:.0f} ms")
    if tokens_per_s is not None:
        parts.append(f"{tokens_per_s:.0f} tok/s")
    return " · ".join(parts)


def decorate_footer(
    footer: str, finish_reason: str | None, error: str | None = None, partial: bool = False
) -> str:
    """``footer`` with how the reply ended: stopped, cut by max tokens, cut off mid-stream, an error."""
    if finish_reason == "cancelled":
        footer = f"■ stopped · {footer}" if footer else "■ stopped"
    elif finish_reason == "length":
        footer = f"{footer} · hit max tokens"
    elif partial:  # a remote stream that broke mid-reply: what came is kept
        footer = f"▲ cut off · {footer}" if footer else "▲ cut off"
    if error:
        footer = f"{footer} · {error}" if footer else error
    return footer


def footer_from_meta(meta: dict[str, Any], finish_reason: str | None) -> str:
    """A saved message's footer, from its meta, as the reply's own was."""
    usage = meta.get("usage") or {}
    footer = usage_footer(
        usage.get("prompt_tokens"),
        usage.get("cached_tokens"),
        meta.get("ttft_ms"),
        meta.get("decode_tokens_per_s"),
        usage.get("reasoning_tokens"),
        usage.get("completion_tokens"),
    )
    footer = decorate_footer(footer, finish_reason, meta.get("error"), bool(meta.get("partial")))
    return with_model(footer, meta.get("model"))


def with_model(footer: str, model: str | None) -> str:
    """``footer`` ending with the model that wrote the reply (``meta["model"]``), where it is known."""
    if not model:
        return footer
    return f"{footer} · {model}" if footer else model


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Token counts over every reply a backend finished: what the panels show for a backend without
    engine stats, and the batch summary for any backend.

    ``prompt_tokens`` and ``cached_tokens`` count the replies whose usage reported both
    (``cache_reports`` of them; the in-process engine reports every reply). ``hit_rate`` is
    cached / prompt tokens over those, None where nothing reported cached tokens (unknown, not 0).
    """

    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cache_reports: int = 0
    hit_rate: float | None = None
