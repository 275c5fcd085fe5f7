"""The scrolling list of messages, anchored to the bottom while a reply streams (until the user scrolls)."""

from __future__ import annotations

from textual.containers import VerticalScroll

from radixchat.chat.conversation import Message
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.message_view import MessageView
from radixchat.tui.widgets.note import Note
from radixchat.tui.widgets.user_message import UserMessage
from radixchat.tui.widgets.welcome import Welcome


class Transcript(VerticalScroll, can_focus=False):
    """Shows one conversation. Rebuilt on branch switches and session loads; appended to per turn."""

    def on_mount(self) -> None:
        self.anchor()

    async def show(self, messages: list[Message], welcome: Welcome | None = None) -> None:
        """Show ``messages``. The tool messages that answer an assistant message's calls are shown in that
        message's call blocks; any other tool message is a note."""
        await self.remove_children()
        widgets = []
        answered: set[int] = set()
        for i, m in enumerate(messages):
            if m.role == "system":
                widgets.append(Note(f"system prompt: {m.content}", "system"))
            elif m.role == "user":
                widgets.append(UserMessage(m, i))
            elif m.role == "assistant":
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
        await self.mount_all(widgets)
        self.anchor()

    async def add(self, *widgets: MessageView | Note) -> None:
        for w in self.query(Welcome):
            await w.remove()
        await self.mount_all(widgets)
        self.anchor()

    def sync_dropped(self) -> None:
        """Show which messages have left the model's context (``Conversation.fit_context``)."""
        for view in self.messages():
            view.sync_dropped()

    def messages(self) -> list[MessageView]:
        return [w for w in self.children if isinstance(w, MessageView)]

    def last_assistant(self) -> AssistantMessage | None:
        views = [w for w in self.children if isinstance(w, AssistantMessage)]
        return views[-1] if views else None
