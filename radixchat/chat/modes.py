"""Conversation modes: ``chat`` (free text), ``json`` (JSON, optionally matching a schema), ``tool``
(free text or a call of one of the declared tools).

A backend turns a mode into the constraint it applies to one reply (``ChatBackend.constraint``, asked
through ``radixchat.chat.backend.grammar_for``): the in-process engine a fresh grammar matcher (the engine
masks every token that cannot continue a valid output), a remote server whatever its API takes.
"""

from __future__ import annotations

from typing import Literal

from radixchat.errors import RadixchatError

Mode = Literal["chat", "json", "tool"]
MODES: tuple[Mode, ...] = ("chat", "json", "tool")


class ModeError(RadixchatError):
    """A mode cannot be used as asked (bad schema, no tools, not available on this backend)."""
