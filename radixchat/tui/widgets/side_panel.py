"""The live side panel: cache tree, hit rate, memory, speed — from ``backend.stats()``, or for a remote
backend (no engine here) from its ``totals()`` and the app's own timings."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from radixchat.tui.context import ContextUse, context_use
from radixchat.tui.widgets.cache_tree import CacheTree
from radixchat.tui.widgets.hit_rate import HitRatePanel
from radixchat.tui.widgets.memory import MemoryPanel
from radixchat.tui.widgets.remote_view import RemoteView
from radixchat.tui.widgets.speed import SpeedPanel

if TYPE_CHECKING:
    from radixchat.chat.backend import ChatBackend
    from radixchat.chat.usage import UsageTotals
    from radixchat.engine.stats import EngineStats
    from radixchat.tui.state import ChatState


STREAMING_INTERVAL = 5.0  # seconds between refreshes while a reply streams


class SidePanel(Vertical):
    refreshing = False  # a refresh is fetching the backend's numbers (the next tick skips)
    refreshed_at = 0.0

    def due(self, streaming: bool) -> bool:
        """Whether a tick should refresh. While a reply streams, every STREAMING_INTERVAL only: a frame costs
        the engine decode speed (its thread needs the GIL between steps), so a short reply should see no
        refresh inside it."""
        now = time.monotonic()
        if self.refreshing or (streaming and now - self.refreshed_at < STREAMING_INTERVAL):
            return False
        self.refreshed_at = now
        return True

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

    async def refresh_from(self, backend: ChatBackend, state: ChatState) -> None:
        """Show ``backend``'s numbers (fetched in a thread: the engine's stats take its lock) and the
        active conversation's path in the cache tree."""
        conv = state.conv
        ids = conv.ids if conv is not None else []

        def fetch() -> tuple[EngineStats | None, list[int], UsageTotals | None]:
            stats = backend.stats()
            return stats, backend.cached_path(ids), backend.totals() if stats is None else None

        self.refreshing = True
        try:
            stats, path, totals = await asyncio.to_thread(fetch)
        finally:
            self.refreshing = False
        if not self.is_attached:  # the app is closing
            return
        if stats is not None:
            self.show(stats, path, list(state.hit_history), context_use(backend, conv))
            return
        view = RemoteView(
            backend.base_url or "the server",
            backend.model_name,
            backend.cache_tree_note or "The KV cache tree lives on the server.",
            totals,
            list(state.hit_history),
            state.last_hit,
            *state.last_speed,
        )
        self.show_remote(view)

    def show_remote(self, view: RemoteView) -> None:
        self._tree_or_note(view.tree_note)
        self.query_one(HitRatePanel).show_remote(view)
        self.query_one(MemoryPanel).show_remote(view.server)
        self.query_one(SpeedPanel).show_remote(view)

    def show(
        self,
        stats: EngineStats,
        path: Iterable[int],
        recent: Sequence[float],
        context: ContextUse | None = None,
    ) -> None:
        self._tree_or_note(None)
        n = len(stats.tree)
        summary = f"{n} node{'' if n == 1 else 's'} · {stats.tree_tokens:,} tokens"
        self.query_one(CacheTree).apply(stats.tree, path, summary)
        self.query_one(HitRatePanel).show(stats, recent)
        self.query_one(MemoryPanel).show(stats, context)
        self.query_one(SpeedPanel).show(stats)
