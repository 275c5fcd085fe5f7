"""What the chat screen's controllers (``TurnControl``, ``SessionControl``) and lenient mode use of the
screen: its widgets, notifications and workers.

The controllers get what they decide on (the backend, the session state, the tools, the mode's
constraint) from the screen's ``ChatCore``, which they are handed when built; of the screen they use only
what these protocols name, so that they need not import the screen (which imports them). Each extends
``ChatHost`` with what it uses besides, and ``ChatScreen`` is all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from textual.app import App
    from textual.notifications import SeverityLevel

    from radixchat.tui.widgets.prompt import PromptInput
    from radixchat.tui.widgets.transcript import Transcript


class ChatHost(Protocol):
    app: App

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
