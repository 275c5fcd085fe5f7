"""Prefix-cache hit rate: cached / prompt tokens overall and for the last turn, and a sparkline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Sparkline, Static

from radixchat.tui.widgets.format import bar, percent

if TYPE_CHECKING:
    from radixchat.engine.stats import EngineStats
    from radixchat.tui.widgets.remote_view import RemoteView

NOT_REPORTED = (
    "the server reports no cached tokens\n"
    "(SGLang: --enable-cache-report;\n vLLM: --enable-prompt-tokens-details)"
)


class HitRatePanel(Vertical):
    def compose(self) -> ComposeResult:
        yield Static("waiting for the model…", classes="numbers", markup=False)
        spark = Sparkline([], summary_function=max)
        spark.display = False
        yield spark

    def on_mount(self) -> None:
        self.border_title = "hit rate"

    def show(self, stats: EngineStats, recent: Sequence[float]) -> None:
        last = stats.last_request
        last_rate = last.cached_tokens / last.prompt_tokens if last and last.prompt_tokens else None
        lines = [
            f"overall   {percent(stats.hit_rate if stats.prompt_tokens else None):>5} {bar(stats.hit_rate, 14)}",
            f"last turn {percent(last_rate):>5} {bar(last_rate or 0.0, 14)}",
            f"{stats.cached_tokens:,} of {stats.prompt_tokens:,} prompt tokens reused",
        ]
        self.query_one(".numbers", Static).update("\n".join(lines))
        self._sparkline(recent)

    def show_remote(self, view: RemoteView) -> None:
        """The server's own reports, summed by the backend (``UsageTotals``); unknown stays unknown."""
        totals = view.totals
        overall = totals.hit_rate if totals is not None else None
        lines = [
            f"overall   {percent(overall):>5} {bar(overall or 0.0, 14)}",
            f"last turn {percent(view.last_hit):>5} {bar(view.last_hit or 0.0, 14)}",
        ]
        if totals is not None and totals.cache_reports:
            lines.append(f"{totals.cached_tokens:,} of {totals.prompt_tokens:,} prompt tokens reused")
        elif totals is not None and totals.turns:
            lines.append(NOT_REPORTED)
        else:
            lines.append("as the server reports it")
        self.query_one(".numbers", Static).update("\n".join(lines))
        self._sparkline(view.recent)

    def _sparkline(self, recent: Sequence[float]) -> None:
        spark = self.query_one(Sparkline)
        spark.data = list(recent)
        spark.styles.width = len(recent)  # one column per turn, newest on the right
        spark.display = len(recent) >= 2
        self.border_subtitle = f"last {len(recent)} turns" if len(recent) >= 2 else ""
