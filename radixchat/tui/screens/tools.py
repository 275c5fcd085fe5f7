"""Tool mode's panel: the tools the model may call, with their parameters."""

from __future__ import annotations

import json
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown, Static


def tools_markdown(tools: list[dict[str, Any]], problem: str | None) -> str:
    lines = []
    if problem:
        lines += [f"> **Not available yet:** {problem}", ""]
    if not tools:
        lines.append("No tools are registered in this build.")
    for spec in tools:
        fn = spec.get("function", spec)
        lines += [f"### `{fn.get('name', '?')}`", "", fn.get("description", ""), ""]
        params = fn.get("parameters")
        if params:
            lines += ["```json", json.dumps(params, indent=2), "```", ""]
    return "\n".join(lines)


class ToolsScreen(ModalScreen[None]):
    CSS_PATH = "tools.tcss"
    BINDINGS = [Binding("escape,q", "dismiss", "Close", id="tools.close")]

    def __init__(self, tools: list[dict[str, Any]], problem: str | None = None) -> None:
        super().__init__()
        self.tools, self.problem = tools, problem

    def compose(self) -> ComposeResult:
        with Vertical(id="tools"):
            yield Static(
                f"Tool mode — {len(self.tools)} tool{'' if len(self.tools) == 1 else 's'}", id="tools-title"
            )
            with VerticalScroll():
                yield Markdown(tools_markdown(self.tools, self.problem))
            yield Static("Esc closes", id="tools-hint")
