"""The line above the prompt that lists the files it attaches (``@path``), each with its size in tokens."""

from __future__ import annotations

from dataclasses import dataclass

from textual.widgets import Static


@dataclass(frozen=True, slots=True)
class AttachmentInfo:
    """One mentioned file as the bar shows it: its size in tokens (None: not known here), or why it
    cannot be attached."""

    name: str
    tokens: int | None = None
    error: str | None = None


class AttachmentBar(Static):
    """Hidden while the prompt attaches nothing. Shows what will be sent before it is: each file and its
    tokens, a file that cannot be attached (the message would not be sent), and a total over the
    model's context (the message would be refused)."""

    DEFAULT_CSS = """
    AttachmentBar {
        height: auto;
        padding: 0 1;
        color: $text-muted;
        display: none;
    }
    AttachmentBar.-shown { display: block; }
    AttachmentBar.-refused { color: $error; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__("", markup=False, **kwargs)  # type: ignore[arg-type]
        self.items: list[AttachmentInfo] = []

    def show_items(self, items: list[AttachmentInfo], context: int | None) -> None:
        self.items = items
        self.set_class(bool(items), "-shown")
        bad = next((i for i in items if i.error is not None), None)
        total = sum(i.tokens or 0 for i in items)
        over = context is not None and total > context
        self.set_class(bad is not None or over, "-refused")
        if bad is not None:
            self.update(f"Cannot send: {bad.error}")
            return
        parts = [i.name if i.tokens is None else f"{i.name} ({i.tokens:,} tokens)" for i in items]
        line = "Attached: " + " · ".join(parts)
        if over:
            line += f" — {total:,} tokens, more than the model's context of {context:,}"
        self.update(line)
