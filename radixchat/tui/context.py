"""How much of the model's context the conversation uses, and what the app says about it (no Textual here).

The status bar and the memory panel show the share; from ``NOTICE_SHARE`` on, the app says once that the
context is filling up, and when earlier turns have left it (``Conversation.fit_context``), how many.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixchat.chat.backend import ChatBackend
from radixchat.chat.conversation import Conversation

NOTICE_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class ContextUse:
    used: int  # tokens of the conversation the model sees (its prompt for the next reply, less the new turn)
    total: int  # the model's context (or the KV pool, if smaller)

    @property
    def share(self) -> float:
        return self.used / self.total if self.total else 0.0

    def label(self) -> str:
        """``context 51%`` for the status bar."""
        return f"context {self.share:.0%}"

    def line(self) -> str:
        """``context 4,210/8,192 tok  51%`` for the memory panel."""
        return f"context {self.used:,}/{self.total:,} tok {self.share:>4.0%}"


def context_use(backend: ChatBackend | None, conv: Conversation | None) -> ContextUse | None:
    """None where the context is not known (a remote server) or there is no conversation yet."""
    if backend is None or conv is None or not backend.context_tokens:
        return None
    return ContextUse(len(conv.ids), backend.context_tokens)


class ContextNotices:
    """What to tell the user after a turn: turns that left the context, or that it is filling up (once
    per crossing of ``NOTICE_SHARE``)."""

    def __init__(self) -> None:
        self._warned = False

    def after_turn(self, backend: ChatBackend, conv: Conversation | None, dropped_turns: int) -> str | None:
        """The notice to show after a turn (None: nothing to say)."""
        if dropped_turns:
            self._warned = False
            s = "" if dropped_turns == 1 else "s"
            return (
                f"{dropped_turns} earlier turn{s} left the model's context to make room; they stay on screen "
                "and in the session, dimmed, but the model no longer sees them"
            )
        use = context_use(backend, conv)
        if use is None or use.share < NOTICE_SHARE:
            self._warned = False
            return None
        if self._warned:
            return None
        self._warned = True
        policy = (conv.context_overflow if conv is not None else None) or backend.context_overflow
        then = (
            "the oldest turns will leave the context"
            if policy == "drop-oldest"
            else "the next turn will be refused (context_overflow is 'error')"
        )
        return (
            f"This conversation uses {use.share:.0%} of the model's context ({use.used:,} of {use.total:,} "
            f"tokens); when it is full, {then}"
        )
