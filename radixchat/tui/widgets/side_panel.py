"""The live side panel: cache tree, hit rate, memory, speed — from ``backend.stats()``, or for a remote
backend (no engine here) from its ``totals`` and the app's own timings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from radixchat.tui.widgets.cache_tree import CacheTree
from radixchat.tui.widgets.hit_rate import HitRatePanel
from radixchat.tui.widgets.memory import MemoryPanel
from radixchat.tui.widgets.speed import SpeedPanel

if TYPE_CHECKING:
    from radixchat.chat.usage import UsageTotals
    from radixchat.engine.stats import EngineStats


@dataclass(slots=True)
class RemoteView:
    """What the panels show for a backend without engine stats (an OpenAI-compatible server)."""

    server: str
    model: str
    tree_note: str
    totals: UsageTotals | None = None  # turns, prompt/cached/completion tokens, hit_rate (None: unknown)
    recent: Sequence[float] = ()
    last_hit: float | None = None
    ttft_ms: float | None = None
    decode_tokens_per_s: float | None = None


class SidePanel(Vertical):
    def compose(self) -> ComposeResult:
        with Vertical(id="tree-box") as box:
            box.border_title = "cache tree"
            box.border_subtitle = "● locked ○ evictable"
            yield CacheTree(id="cache-tree")
            note = Static("", id="tree-note", markup=False)
            note.display = False
            yield note
        yield HitRatePanel(id="hit-rate")
        yield MemoryPanel(id="memory")
        yield SpeedPanel(id="speed")

    def _tree_or_note(self, note: str | None) -> None:
        tree, static = self.query_one(CacheTree), self.query_one("#tree-note", Static)
        tree.display, static.display = note is None, note is not None
        if note is not None:
            static.update(note)
        self.query_one("#tree-box").border_subtitle = "● locked ○ evictable" if note is None else ""

    def show_remote(self, view: RemoteView) -> None:
        self._tree_or_note(view.tree_note)
        self.query_one(HitRatePanel).show_remote(view)
        self.query_one(MemoryPanel).show_remote(view.server)
        self.query_one(SpeedPanel).show_remote(view)

    def show(self, stats: EngineStats, path: Iterable[int], recent: Sequence[float]) -> None:
        self._tree_or_note(None)
        n = len(stats.tree)
        summary = f"{n} node{'' if n == 1 else 's'} · {stats.tree_tokens:,} tokens"
        self.query_one(CacheTree).apply(stats.tree, path, summary)
        self.query_one(HitRatePanel).show(stats, recent)
        self.query_one(MemoryPanel).show(stats)
        self.query_one(SpeedPanel).show(stats)
