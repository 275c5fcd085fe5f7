"""What an empty chat shows: the model, its loading progress, and the first keys to know."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

HINTS = (
    "Enter sends · Ctrl+J newline · ↑/↓ earlier prompts · Esc stops a reply\n"
    "Ctrl+T mode · Ctrl+O sessions · Ctrl+B panels · Ctrl+P commands · F1 help"
)


class Welcome(Vertical):
    def __init__(self, model: str, status: str, error: bool = False) -> None:
        super().__init__()
        self.model = model
        self.status = status
        self.error = error

    def compose(self) -> ComposeResult:
        yield Static("radixchat", classes="title")
        yield Static(self.model, markup=False, classes="model")
        yield Static(self.status, markup=False, classes="status -error" if self.error else "status")
        yield Static(HINTS, markup=False, classes="hints")

    def set_status(self, text: str, error: bool = False) -> None:
        self.status, self.error = text, error
        for status in self.query(".status").results(Static):
            status.update(text)
            status.set_class(error, "-error")
