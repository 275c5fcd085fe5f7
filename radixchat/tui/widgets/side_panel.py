"""The live side panel: cache tree, hit rate, memory, speed — all from ``backend.stats()``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from radixchat.tui.widgets.cache_tree import CacheTree
from radixchat.tui.widgets.hit_rate import HitRatePanel
from radixchat.tui.widgets.memory import MemoryPanel
from radixchat.tui.widgets.speed import SpeedPanel

if TYPE_CHECKING:
    from radixchat.engine.stats import EngineStats


class SidePanel(Vertical):
    def compose(self) -> ComposeResult:
        with Vertical(id="tree-box") as box:
            box.border_title = "cache tree"
            box.border_subtitle = "● locked ○ evictable"
            yield CacheTree(id="cache-tree")
        yield HitRatePanel(id="hit-rate")
        yield MemoryPanel(id="memory")
        yield SpeedPanel(id="speed")

    def show_note(self, note: str) -> None:
        """No engine stats (a remote backend keeps its cache on the server): say so in every panel."""
        self.query_one(CacheTree).root.set_label(note)
        self.query_one(HitRatePanel).query_one(".numbers", Static).update(note)
        self.query_one(MemoryPanel).update(note)
        self.query_one(SpeedPanel).update(note)

    def show(self, stats: EngineStats, path: Iterable[int], recent: Sequence[float]) -> None:
        summary = f"{len(stats.tree)} nodes · {stats.tree_tokens:,} tokens"
        self.query_one(CacheTree).apply(stats.tree, path, summary)
        self.query_one(HitRatePanel).show(stats, recent)
        self.query_one(MemoryPanel).show(stats)
        self.query_one(SpeedPanel).show(stats)
