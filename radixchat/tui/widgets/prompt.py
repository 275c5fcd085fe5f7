"""The multi-line prompt: Enter sends, Ctrl+J (or Shift/Alt+Enter) inserts a newline, Up/Down recall,
Tab completes an ``@path``."""

from __future__ import annotations

import re
from pathlib import Path

from textual.binding import Binding
from textual.widgets import TextArea

from radixchat.chat.attachments import complete_path
from radixchat.tui.messages import PromptSubmitted
from radixchat.tui.widgets.ordered_keys import OrderedKeys


class PromptHistory:
    """Earlier prompts, newest last; ``older``/``newer`` walk them like a shell does."""

    def __init__(self, items: list[str] | None = None, limit: int = 500) -> None:
        self.items: list[str] = list(items or [])[-limit:]
        self.limit = limit
        self._pos: int | None = None  # index into items while browsing
        self._draft = ""

    def add(self, text: str) -> None:
        if text.strip() and (not self.items or self.items[-1] != text):
            self.items.append(text)
            del self.items[: -self.limit]
        self._pos = None

    def older(self, current: str) -> str | None:
        if not self.items:
            return None
        if self._pos is None:
            self._draft, self._pos = current, len(self.items)
        if self._pos == 0:
            return None
        self._pos -= 1
        return self.items[self._pos]

    def newer(self) -> str | None:
        if self._pos is None:
            return None
        self._pos += 1
        if self._pos >= len(self.items):
            self._pos = None
            return self._draft
        return self.items[self._pos]

    def reset(self) -> None:
        self._pos = None


class PromptInput(OrderedKeys, TextArea):
    """The message box at the bottom of the chat.

    Its keys (and TextArea's own editing keys, and the screen's) run from ``OrderedKeys._on_key``, in the
    order they arrive: left to Textual, a priority binding runs when the App first sees the key, before
    the keys typed just ahead of it have reached the text (Enter sent a stale prompt); a plain binding
    runs after the key bubbles back up, behind the printable keys that followed it (Backspace landed after
    them). Keys arrive in such bursts from fast typing, tmux send-keys, or a paste without bracketed paste.
    """

    BINDINGS = [
        Binding("enter", "submit", "Send", id="prompt.send"),
        Binding("ctrl+j,shift+enter,alt+enter", "newline", "Newline", id="prompt.newline", key_display="^J"),
        Binding("up", "history_older", "Earlier prompt", id="prompt.history_older", show=False),
        Binding("down", "history_newer", "Later prompt", id="prompt.history_newer", show=False),
        Binding("tab", "complete", "Complete @path", id="prompt.complete", show=False),
    ]

    def __init__(self, history: PromptHistory | None = None, **kwargs: object) -> None:
        super().__init__(
            soft_wrap=True, show_line_numbers=False, compact=True, tab_behavior="focus", **kwargs
        )  # type: ignore[arg-type]
        self.prompts = history or PromptHistory()

    def action_submit(self) -> None:
        text = self.text
        if text.strip():
            self.post_message(PromptSubmitted(text))

    def action_newline(self) -> None:
        self.insert("\n")

    def action_history_older(self) -> None:
        if self.cursor_location[0] > 0:
            self.action_cursor_up()
            return
        text = self.prompts.older(self.text)
        if text is not None:
            self._show(text, at_end=False)

    def action_history_newer(self) -> None:
        if self.cursor_location[0] < self.document.line_count - 1:
            self.action_cursor_down()
            return
        text = self.prompts.newer()
        if text is not None:
            self._show(text, at_end=True)

    def action_complete(self) -> None:
        """After ``@`` and part of a path: complete it as far as the files agree (from the working
        directory). Elsewhere Tab moves the focus on, as it does without this binding."""
        row, col = self.cursor_location
        mention = re.search(r"(?:^|\s)@(\S*)$", self.document.get_line(row)[:col])
        if mention is None:
            self.screen.focus_next()
            return
        done = complete_path(mention.group(1), Path.cwd())
        if done is not None:
            self.insert(done[len(mention.group(1)) :])

    def accept(self, text: str) -> None:
        """The app sent ``text``: remember it and clear the box."""
        self.prompts.add(text)
        self.clear()

    def _show(self, text: str, at_end: bool) -> None:
        self.load_text(text)
        # Land where the next Up/Down continues the walk: top line going back, bottom line going forward.
        self.move_cursor(self.document.end if at_end else (0, len(self.document.get_line(0))))
