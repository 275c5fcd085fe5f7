"""Speed of the last turn and what the engine is doing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Static

if TYPE_CHECKING:
    from radixchat.engine.stats import EngineStats
    from radixchat.tui.widgets.remote_view import RemoteView


class SpeedPanel(Static):
    def on_mount(self) -> None:
        self.border_title = "speed"
        self.update("waiting for the model…")

    def show(self, stats: EngineStats) -> None:
        last = stats.last_request
        ttft = f"{last.ttft_s * 1000:.0f} ms" if last and last.ttft_s is not None else "–"
        tps = (
            f"{last.decode_tokens_per_s:.1f} tok/s" if last and last.decode_tokens_per_s is not None else "–"
        )
        lines = [
            f"TTFT    {ttft}",
            f"decode  {tps}",
            f"engine  {stats.running} running, {stats.waiting} waiting",
            f"model   {stats.model}",
            f"        {stats.device} · {stats.dtype}",
        ]
        self.update("\n".join(lines))

    def show_remote(self, view: RemoteView) -> None:
        """Timings measured here, on the client (network included)."""
        ttft = f"{view.ttft_ms:.0f} ms" if view.ttft_ms is not None else "–"
        tps = f"{view.decode_tokens_per_s:.1f} tok/s" if view.decode_tokens_per_s is not None else "–"
        turns = view.totals.turns if view.totals is not None else 0
        lines = [
            f"TTFT    {ttft}",
            f"decode  {tps}",
            "        (measured here, network included)",
            f"replies {turns}",
            f"model   {view.model}",
            f"server  {view.server}",
        ]
        self.update("\n".join(lines))
