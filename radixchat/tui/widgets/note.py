"""A one-off line in the transcript that is not a model message: system prompt, errors, notices."""

from __future__ import annotations

from textual.widgets import Static


class Note(Static):
    """``kind`` is a CSS class: system | error | info."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(text, markup=False, classes=kind)
