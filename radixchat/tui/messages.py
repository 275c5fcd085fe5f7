"""The app's own Textual messages: what widgets and workers tell the app and the chat screen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from radixchat.chat.backend import ChatBackend, TurnResult


class ChatShown(Message):
    """The chat screen is up (its transcript shows, the prompt takes input): the app loads the backend."""


class EngineProgress(Message):
    """A line of loading progress from the backend factory (posted from the loading thread)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class EngineReady(Message):
    def __init__(self, backend: ChatBackend) -> None:
        super().__init__()
        self.backend = backend


class EngineFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class PromptSubmitted(Message):
    """The prompt's Enter: the app decides whether the text is sent (and then clears the prompt)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class EditRequested(Message):
    """Edit the user message at ``index`` of the active conversation (a new branch on send)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index


class RegenerateRequested(Message):
    pass


class TurnFinished(Message):
    """A reply ended (stopped, failed or complete); ``result`` is a TurnResult or None on failure."""

    def __init__(self, result: TurnResult | None) -> None:
        super().__init__()
        self.result = result


class SwitchModelRequested(Message):
    """Switch the chat to the model ``spec`` names (the app runs the switch, as F7's picker does)."""

    def __init__(self, spec: str) -> None:
        super().__init__()
        self.spec = spec
