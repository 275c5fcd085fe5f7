"""The base of every message in the transcript: focusable, copyable, walkable with Up/Down."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Vertical

from radixchat.chat.conversation import Message
from radixchat.tui.widgets.prompt import PromptInput


class MessageView(Vertical, can_focus=True):
    """One message of the active conversation; ``index`` is its place in ``conversation.messages``."""

    BINDINGS = [
        Binding("c", "copy", "Copy", id="message.copy"),
        Binding("up", "neighbour(-1)", "Previous message", id="message.previous", show=False),
        Binding("down", "neighbour(1)", "Next message", id="message.next", show=False),
        Binding("i", "back_to_prompt", "Back to prompt", id="message.back", show=False),
    ]

    def __init__(self, message: Message, index: int, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.message = message
        self.index = index
        self.sync_dropped()

    def sync_dropped(self) -> None:
        """Show whether the message has left the model's context (kept on screen, dimmed)."""
        dropped = self.message.dropped
        self.set_class(dropped, "-dropped")
        if dropped:
            self.border_subtitle = "outside the model's context"

    def copy_text(self) -> str:
        return self.message.content

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.copy_text())
        self.notify("Copied the message to the clipboard", timeout=2)

    def action_neighbour(self, step: int) -> None:
        views = self._shown()
        i = views.index(self) + step
        if i < 0 and hasattr(self.parent, "reveal_earlier"):  # the first shown: show the earlier ones
            self.parent.reveal_earlier()
            views = self._shown()
            i = views.index(self) + step
        if 0 <= i < len(views):
            views[i].focus()
            views[i].scroll_visible()
        elif step > 0:
            self.action_back_to_prompt()

    def _shown(self) -> list[MessageView]:
        siblings = self.parent.children if self.parent else []
        return [w for w in siblings if isinstance(w, MessageView) and w.display]

    def action_back_to_prompt(self) -> None:
        self.screen.query_one(PromptInput).focus()
