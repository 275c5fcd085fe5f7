"""A reply's thinking: a folded block above its answer that streams while the model thinks.

Folded, it is one line (``▶ Thinking… 123 tokens`` while it streams, ``▶ Thought for 123 tokens`` after);
unfolded, the reasoning in dim text. F6 (binding ``thinking.toggle``) shows or hides every reply's
thinking at once: the app carries the class ``-show-thinking`` while it is shown, which blocks mounted
later follow too. A click on a block's title folds or unfolds that one alone.
"""

from __future__ import annotations

from textual.app import App
from textual.widgets import Collapsible, Static

SHOWN = "-show-thinking"  # on the app while thinking is shown


def toggle_thinking(app: App) -> bool:
    """Show every reply's thinking, or hide it; returns whether it is shown now."""
    app.toggle_class(SHOWN)
    shown = app.has_class(SHOWN)
    for block in app.screen.query(ThinkingBlock):
        block.collapsed = not shown
    return shown


class ThinkingBlock(Collapsible):
    def __init__(self, reasoning: str = "", tokens: int | None = None, streaming: bool = False) -> None:
        self.text, self.tokens, self.streaming = reasoning, tokens, streaming
        self._pieces = 0  # deltas streamed (≈ tokens until the reply says how many)
        super().__init__(Static(reasoning, markup=False, classes="thinking-text"), title=self._heading())

    def on_mount(self) -> None:
        self.collapsed = not self.app.has_class(SHOWN)

    def _heading(self) -> str:
        if self.streaming:
            return f"Thinking… {self._pieces} tokens"
        return f"Thought for {self.tokens} tokens" if self.tokens is not None else "Thought"

    def add(self, text: str, pieces: int) -> None:
        """Streamed reasoning: ``text`` more, ``pieces`` more deltas."""
        self.text += text
        self._pieces += pieces
        self.query_one(".thinking-text", Static).update(self.text)
        self.title = self._heading()

    def finish(self, reasoning: str, tokens: int | None) -> None:
        """The reply is over: the reasoning as the message keeps it, and its token count."""
        self.text, self.tokens, self.streaming = reasoning, tokens, False
        self.query_one(".thinking-text", Static).update(reasoning)
        self.title = self._heading()
