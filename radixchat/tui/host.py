"""What the chat screen's controllers (``TurnControl``, ``SessionControl``) use of the screen.

A typed protocol, so that the controllers need not import the screen (which imports them): each extends
``ChatHost`` with what it uses besides, and ``ChatScreen`` is all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.app import App
    from textual.notifications import SeverityLevel

    from radixchat.chat.backend import ChatBackend
    from radixchat.chat.tools import Tool, ToolRegistry
    from radixchat.config import Settings
    from radixchat.tui.state import ChatState
    from radixchat.tui.widgets.prompt import PromptInput
    from radixchat.tui.widgets.transcript import Transcript


class ChatHost(Protocol):
    app: App
    settings: Settings
    state: ChatState
    backend: ChatBackend | None  # None until loaded, and while shutting down
    registry: ToolRegistry
    mode_problem: str | None  # why the mode cannot be used now

    @property
    def transcript(self) -> Transcript: ...
    @property
    def prompt(self) -> PromptInput: ...
    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
    ) -> None: ...
    def update_status(self, activity: str | None = None) -> None:
        """The status line (``activity``: what is going on, None: the usual one for the state)."""
        ...

    def offered_tools(self) -> list[Tool]: ...
    def tool_declarations(self) -> list[dict[str, Any]]: ...
