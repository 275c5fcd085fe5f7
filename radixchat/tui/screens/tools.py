"""Tool mode's panel: which declared tools the model is offered, and its tool_choice."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Markdown, Select, SelectionList, Static
from textual.widgets.selection_list import Selection

from radixchat.chat.session_state import ToolChoice
from radixchat.chat.tools import Tool
from radixchat.tui.tools import CHOICES

CHOICE_HELP = {
    "auto": "auto — answer, or call tools",
    "required": "required — call at least one tool first",
    "none": "none — answer without calling",
}


class ToolSetup(NamedTuple):
    names: list[str]  # the offered tools, in the registry's order
    choice: ToolChoice


def tool_markdown(tool: Tool, command: list[str] | None = None) -> str:
    lines = [f"### `{tool.name}`", "", tool.description or "*(no description)*", ""]
    if tool.builtin:
        lines += ["Built in: runs inside radixchat, never asks.", ""]
    elif tool.source.startswith("mcp:"):
        via = f" (`{' '.join(command)}`)" if command else ""
        lines += [f"From the MCP server **{tool.source[4:]}**{via} — asks before each call.", ""]
    else:
        shown = " ".join(command) if command else "a command"
        lines += [f"Runs `{shown}` — asks before each call (or *always allow* it for the session).", ""]
    lines += ["```json", json.dumps(tool.parameters, indent=2, ensure_ascii=False), "```"]
    return "\n".join(lines)


def choice_value(choice: ToolChoice) -> str:
    return f"call:{choice['name']}" if isinstance(choice, dict) else choice


class ToolList(SelectionList[str]):
    """Space toggles the highlighted tool at once. Textual's SelectionList posts itself a message and
    toggles when it gets it, after a Ctrl+S that arrived in the same burst of keys has applied."""

    def action_select(self) -> None:
        self._toggle_highlighted_selection()


class ToolsScreen(ModalScreen[ToolSetup | None]):
    """Dismisses with the new ``ToolSetup``, or None when cancelled."""

    CSS_PATH = "tools.tcss"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="tools.cancel"),
        # Not a priority binding: it must act after the keys typed before it (widgets/ordered_keys.py).
        Binding("ctrl+s", "apply", "Apply", id="tools.apply"),
    ]

    def __init__(
        self,
        tools: list[Tool],
        offered: list[str],
        choice: ToolChoice,
        problem: str | None = None,
        commands: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__()
        self.tools, self.offered, self.choice = tools, offered, choice
        self.problem = problem
        self.commands = commands or {}

    def compose(self) -> ComposeResult:
        with Vertical(id="tools"):
            yield Static("Tool mode — the tools the model may call", id="tools-title")
            if self.problem:
                yield Static(f"⚠ {self.problem}", id="tools-problem", markup=False)
            with Horizontal(id="tools-body"):
                yield ToolList(
                    *(
                        Selection(
                            f"{t.name}  ·  {'built-in' if t.builtin else 'asks first'}"
                            + (f" · {t.source}" if t.source.startswith("mcp:") else ""),
                            t.name,
                            t.name in self.offered,
                            id=t.name,
                        )
                        for t in self.tools
                    ),
                    id="tools-list",
                )
                with VerticalScroll(id="tools-detail"):
                    yield Markdown("", id="tools-doc")
            with Horizontal(id="tools-choice"):
                yield Label("tool_choice")
                yield Select(self.choice_options(), value=choice_value(self.choice), allow_blank=False)
            yield Static("", id="tools-error", markup=False)
            with Horizontal(classes="buttons"):
                yield Static("Space toggles · Ctrl+S applies · Esc cancels", id="tools-hint")
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    def choice_options(self) -> list[tuple[str, str]]:
        named = [(f"{t.name} — always call {t.name}", f"call:{t.name}") for t in self.tools]
        return [(CHOICE_HELP[c], c) for c in CHOICES] + named

    def on_mount(self) -> None:
        options = self.query_one(SelectionList)
        options.focus()
        if self.tools:
            options.highlighted = 0
            self.show_tool(self.tools[0])

    def on_selection_list_selection_highlighted(self, event: SelectionList.SelectionHighlighted) -> None:
        tool = next((t for t in self.tools if t.name == event.selection.value), None)
        if tool is not None:
            self.show_tool(tool)

    def show_tool(self, tool: Tool) -> None:
        self.query_one("#tools-doc", Markdown).update(tool_markdown(tool, self.commands.get(tool.name)))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_apply()
        else:
            self.dismiss(None)

    def setup(self) -> ToolSetup:
        """What the screen shows now; raises ValueError with what is wrong with it."""
        chosen = set(self.query_one(SelectionList).selected)
        names = [t.name for t in self.tools if t.name in chosen]
        value = str(self.query_one(Select).value)
        choice: Any = {"name": value.removeprefix("call:")} if value.startswith("call:") else value
        if not names:
            raise ValueError("choose at least one tool")
        if isinstance(choice, dict) and choice["name"] not in names:
            raise ValueError(f"tool_choice names {choice['name']}, which is not offered")
        return ToolSetup(names, choice)

    def action_apply(self) -> None:
        try:
            setup = self.setup()
        except ValueError as exc:
            self.query_one("#tools-error", Static).update(str(exc))
            return
        self.dismiss(setup)

    def action_cancel(self) -> None:
        self.dismiss(None)
