"""KV pool and device memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Static

from radixchat.tui.widgets.format import bar, human_bytes

if TYPE_CHECKING:
    from radixchat.engine.stats import EngineStats
    from radixchat.tui.context import ContextUse


class MemoryPanel(Static):
    def on_mount(self) -> None:
        self.border_title = "memory"
        self.update("waiting for the model…")

    def show(self, stats: EngineStats, context: ContextUse | None = None) -> None:
        cap = max(stats.pool_capacity, 1)
        used = stats.pool_used
        lines = [context.line()] if context is not None else []
        lines += [
            f"KV pool {used:,}/{stats.pool_capacity:,} tok {used / cap:>4.0%}",
            f"        {bar(used / cap, 22)}",
            f"        {human_bytes(used * stats.bytes_per_token)} of {human_bytes(stats.pool_bytes)}",
            f"tree    {stats.tree_tokens:,} tok, {stats.tree_protected:,} locked",
        ]
        if stats.device_allocated is not None:
            lines += [
                f"{stats.device:<7} {human_bytes(stats.device_allocated)} allocated",
                f"        {human_bytes(stats.device_reserved)} reserved",
            ]
        else:
            lines.append(f"{stats.device:<7} RSS {human_bytes(stats.process_rss)}")
        compiled = {"ready": " · compiled", "compiling": " · compiling…"}.get(stats.decode_compiled, "")
        if stats.decode_compiled.startswith("off: "):  # not compiled for want of memory
            compiled = " · not compiled: low memory"
        lines.append(f"weights {stats.weights_format}{compiled}")
        lines.append(f"KV      {stats.kv_dtype} · {stats.decode_attention}")
        if stats.deterministic:
            lines.append("        deterministic")
        self.update("\n".join(lines))

    def show_remote(self, server: str) -> None:
        self.update(
            f"Nothing local to show: the model, its KV pool and the device memory are on the server,\n{server}"
        )
