"""The scrolling list of messages, anchored to the bottom while a reply streams (until the user scrolls)."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from radixchat.chat.conversation import Message
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.message_view import MessageView
from radixchat.tui.widgets.note import Note
from radixchat.tui.widgets.user_message import UserMessage
from radixchat.tui.widgets.welcome import Welcome

#: Messages laid out at once. Every widget of the transcript takes part in each layout, and a streaming reply
#: lays the screen out at every write: with a long session open (hundreds of messages) each write cost the
#: app's thread a tenth of a second, which the engine's decode lost. Earlier messages wait, hidden, behind a
#: line that shows them.
VISIBLE = 40


class EarlierMessages(Static):
    """The line above the shown messages: how many earlier ones are hidden. Click it (or press Up on the
    first message) to show them."""

    def show_count(self, n: int) -> None:
        self.display = n > 0
        self.update(f"▲ {n} earlier message{'' if n == 1 else 's'} — click, or Up from the first message")

    def on_click(self) -> None:
        if isinstance(self.parent, Transcript):
            self.parent.reveal_earlier()


def switch_note(model: str) -> Note:
    """The divider where the conversation moved to another model."""
    return Note(f"─── switched to {model} ───", "switch")


class Transcript(VerticalScroll, can_focus=False):
    """Shows one conversation. Rebuilt on branch switches and session loads; appended to per turn. Only the
    last ``VISIBLE`` messages are laid out; earlier ones are shown on request (``reveal_earlier``)."""

    def on_mount(self) -> None:
        self.anchor()

    async def show(self, messages: list[Message], welcome: Welcome | None = None) -> None:
        """Show ``messages``. The tool messages that answer an assistant message's calls are shown in that
        message's call blocks; any other tool message is a note."""
        await self.remove_children()
        widgets: list[Widget] = []
        answered: set[int] = set()
        turn, model = 0, None  # where the current turn's widgets start; the model of the last reply
        for i, m in enumerate(messages):
            if m.role == "system":
                widgets.append(Note(f"system prompt: {m.content}", "system"))
            elif m.role == "user":
                turn = len(widgets)
                widgets.append(UserMessage(m, i))
            elif m.role == "assistant":
                wrote = m.meta.get("model")
                if wrote and model and wrote != model:  # the conversation moved to another model (F7)
                    widgets.insert(turn, switch_note(wrote))
                model = wrote or model
                results = []
                for j in range(i + 1, i + 1 + len(m.tool_calls or [])):
                    if j >= len(messages) or messages[j].role != "tool":
                        break
                    results.append(messages[j])
                    answered.add(j)
                widgets.append(AssistantMessage(m, i, results=results))
            elif i not in answered:
                widgets.append(Note(f"tool {m.name or ''} → {m.content}", "tool"))
        if welcome is not None and not any(m.role != "system" for m in messages):
            widgets.insert(0, welcome)
        await self.mount_all([EarlierMessages(markup=False, id="earlier"), *widgets])
        self._trim()
        self.anchor()

    async def add(self, *widgets: MessageView | Note) -> None:
        for w in self.query(Welcome):
            await w.remove()
        await self.mount_all(widgets)
        self._trim()
        self.anchor()

    def _items(self) -> list[Widget]:
        return [w for w in self.children if not isinstance(w, EarlierMessages)]

    def _trim(self, visible: int = VISIBLE) -> None:
        """Hide what comes before the last ``visible`` messages (more are never laid out at once)."""
        items = self._items()
        views = [i for i, w in enumerate(items) if isinstance(w, MessageView) and w.display]
        if len(views) > visible:
            for w in items[: views[-visible]]:
                w.display = False
        self._count_hidden()

    def _count_hidden(self) -> None:
        hidden = sum(1 for w in self._items() if isinstance(w, MessageView) and not w.display)
        for note in self.query(EarlierMessages):
            note.show_count(hidden)

    def reveal_earlier(self, n: int = VISIBLE) -> None:
        """Show up to ``n`` more of the hidden earlier messages (and what lies between them)."""
        items = self._items()
        hidden = [i for i, w in enumerate(items) if isinstance(w, MessageView) and not w.display]
        if not hidden:
            return
        start = hidden[-n] if len(hidden) >= n else 0
        for w in items[start:]:
            w.display = True
        self._count_hidden()

    def sync_dropped(self) -> None:
        """Show which messages have left the model's context (``Conversation.fit_context``)."""
        for view in self.messages():
            view.sync_dropped()

    def messages(self) -> list[MessageView]:
        return [w for w in self.children if isinstance(w, MessageView)]

    def last_assistant(self) -> AssistantMessage | None:
        views = [w for w in self.children if isinstance(w, AssistantMessage)]
        return views[-1] if views else None
