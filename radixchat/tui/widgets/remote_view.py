"""What the panels show for a backend without engine stats (an OpenAI-compatible server)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixchat.chat.usage import UsageTotals


@dataclass(slots=True)
class RemoteView:
    server: str
    model: str
    tree_note: str
    totals: UsageTotals | None = None  # turns, prompt/cached/completion tokens, hit_rate (None: unknown)
    recent: Sequence[float] = ()
    last_hit: float | None = None
    ttft_ms: float | None = None
    decode_tokens_per_s: float | None = None
