"""Asks before a user tool runs: the tool, what it does, the command or MCP server, the JSON arguments.

User tools run commands from the config file or go to its MCP servers, so each call needs the user's yes:
*Allow once*, *Always allow this tool* (for the rest of the session), or *Deny* (the model gets an error
result and goes on).
The allow answers are held back for ``ARM_DELAY`` seconds after the dialog opens, so keys typed for the
prompt just as it appears cannot allow a call; Deny works at once and has the focus.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Markdown, Static

from radixchat.chat.tools import Tool

Answer = Literal["once", "always", "deny"]
ARM_DELAY = 0.5  # seconds before the allow answers take effect


def consent_markdown(tool: Tool, arguments: Any, command: list[str] | None) -> str:
    lines = [tool.description or "*(no description)*", ""]
    if tool.source.startswith("mcp:"):
        server = tool.source.removeprefix("mcp:")
        via = f" (`{' '.join(command)}`)" if command else ""
        lines += [f"Sent to the MCP server **{server}**{via} with these arguments:", ""]
    elif command:
        lines += [f"Runs `{' '.join(command)}` with these arguments as JSON on stdin:", ""]
    lines += ["```json", json.dumps(arguments, indent=2, ensure_ascii=False), "```"]
    return "\n".join(lines)


class ConsentScreen(ModalScreen[Answer]):
    CSS_PATH = "consent.tcss"
    BINDINGS = [
        Binding("y", "answer('once')", "Allow once", id="consent.once"),
        Binding("a", "answer('always')", "Always allow (this session)", id="consent.always"),
        Binding("n,escape", "answer('deny')", "Deny", id="consent.deny"),
        Binding("left", "app.focus_previous", "Previous button", id="consent.previous", show=False),
        Binding("right", "app.focus_next", "Next button", id="consent.next", show=False),
    ]

    def __init__(
        self, tool: Tool, arguments: Any, command: list[str] | None = None, arm_delay: float | None = None
    ) -> None:
        super().__init__()
        self.tool, self.arguments, self.command = tool, arguments, command
        self.arm_delay = ARM_DELAY if arm_delay is None else arm_delay
        self.armed = self.arm_delay <= 0

    def compose(self) -> ComposeResult:
        with Vertical(id="consent"):
            yield Static(f"Run the tool {self.tool.name}?", id="consent-title", markup=False)
            with VerticalScroll(id="consent-body"):
                yield Markdown(consent_markdown(self.tool, self.arguments, self.command))
            with Horizontal(classes="buttons"):
                yield Button("Allow once (y)", variant="success", id="once", disabled=not self.armed)
                yield Button(
                    f"Always allow {self.tool.name} (a)",
                    variant="warning",
                    id="always",
                    disabled=not self.armed,
                )
                yield Button("Deny (n)", variant="error", id="deny")
            yield Static(
                "y once · a always (this session) · n or Esc deny — the model is told either way",
                id="consent-hint",
            )

    def on_mount(self) -> None:
        self.query_one("#deny", Button).focus()
        if not self.armed:
            self.set_timer(self.arm_delay, self.arm)

    def arm(self) -> None:
        self.armed = True
        for button in self.query(Button):
            button.disabled = False

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_answer(event.button.id or "deny")

    def action_answer(self, answer: str) -> None:
        if answer != "deny" and not self.armed:
            return
        self.dismiss(answer)  # type: ignore[arg-type]
