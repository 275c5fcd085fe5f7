"""Conversation modes: ``chat`` (free text), ``json`` (JSON constrained by a schema), ``tool``.

``grammar_for`` turns a mode into the token matcher the engine applies while sampling (None for chat).
"""

from __future__ import annotations

from typing import Any, Literal

from radixchat.errors import RadixchatError

Mode = Literal["chat", "json", "tool"]
MODES: tuple[Mode, ...] = ("chat", "json", "tool")


class ModeError(RadixchatError):
    """A mode cannot be used as asked (bad schema, unknown tool, not available)."""


def grammar_for(backend: Any, mode: Mode, schema: Any = None, tools: list[dict] | None = None) -> Any | None:
    """A fresh matcher for one reply in ``mode`` (None: unconstrained). Raises ModeError."""
    if mode == "chat":
        return None
    raise ModeError(f"{mode} mode is not available in this build yet")
