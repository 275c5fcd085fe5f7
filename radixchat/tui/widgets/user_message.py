"""A user's message: plain text (never parsed as Markdown), editable into a new branch."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from radixchat.tui.messages import EditRequested
from radixchat.tui.widgets.message_view import MessageView


class UserMessage(MessageView):
    BINDINGS = [Binding("e", "edit", "Edit (new branch)", id="message.edit")]

    def compose(self) -> ComposeResult:
        yield Static(self.message.content, markup=False, classes="body")

    def on_mount(self) -> None:
        self.border_title = "you"

    def action_edit(self) -> None:
        self.post_message(EditRequested(self.index))
