"""JSON mode's input: a JSON Schema, pasted or read from a file (none = any JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static, TextArea

from radixchat.tui.widgets.ordered_keys import OrderedInput, OrderedTextArea


def parse_schema(text: str) -> dict[str, Any] | bool | None:
    """The schema in ``text`` (None when blank). Raises ValueError with a one-line message."""
    if not text.strip():
        return None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(schema, (dict, bool)):
        raise ValueError("a JSON Schema is an object (or true/false)")
    return schema


class SchemaScreen(ModalScreen[tuple[dict[str, Any] | bool | None] | None]):
    """Dismisses with ``(schema,)`` — ``(None,)`` for plain JSON — or None when cancelled."""

    CSS_PATH = "schema.tcss"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="schema.cancel"),
        # Not a priority binding: it must act after the keys typed before it (widgets/ordered_keys.py).
        Binding("ctrl+s", "apply", "Apply", id="schema.apply"),
    ]

    def __init__(self, schema: dict[str, Any] | bool | None) -> None:
        super().__init__()
        self.schema = schema

    def compose(self) -> ComposeResult:
        text = "" if self.schema is None else json.dumps(self.schema, indent=2)
        with Vertical(id="schema"):
            yield Static("JSON mode — schema for the replies (blank: any JSON)", id="schema-title")
            yield OrderedTextArea(text, language="json", id="schema-text", show_line_numbers=True)
            with Horizontal(id="schema-file"):
                yield OrderedInput(placeholder="or a schema file: path/to/schema.json", id="schema-path")
                yield Button("Load file", id="load")
            yield Static("", id="schema-error", markup=False)
            yield Static("Ctrl+S applies · Esc cancels", id="schema-hint")
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Plain JSON", id="clear")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#schema-text", TextArea).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.load_file(event.value)  # as it was at Enter

    def on_button_pressed(self, event: Button.Pressed) -> None:
        match event.button.id:
            case "apply":
                self.action_apply()
            case "clear":
                self.dismiss((None,))
            case "load":
                self.load_file()
            case _:
                self.dismiss(None)

    def load_file(self, path: str | None = None) -> None:
        raw = (self.query_one("#schema-path", Input).value if path is None else path).strip()
        if not raw:
            return
        try:
            text = Path(raw).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.error(f"cannot read {raw}: {exc.strerror if isinstance(exc, OSError) else exc}")
            return
        self.query_one("#schema-text", TextArea).load_text(text)
        self.error("")

    def error(self, text: str) -> None:
        self.query_one("#schema-error", Static).update(text)

    def action_apply(self) -> None:
        try:
            schema = parse_schema(self.query_one("#schema-text", TextArea).text)
        except ValueError as exc:
            self.error(str(exc))
            return
        self.dismiss((schema,))

    def action_cancel(self) -> None:
        self.dismiss(None)
