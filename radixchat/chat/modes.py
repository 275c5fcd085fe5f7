"""Conversation modes: ``chat`` (free text), ``json`` (JSON, optionally matching a schema), ``tool``
(free text or a call of one of the declared tools).

What one reply is constrained to is a ``ConstraintSpec`` (the mode and its inputs), handed as one value
through every layer. A backend turns it into the constraint it applies to that reply
(``ChatBackend.constraint``, asked through ``radixchat.chat.backend.grammar_for``): the in-process engine a
fresh grammar matcher (the engine masks every token that cannot continue a valid output), a remote server
whatever its API takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from radixchat.errors import RadixchatError

Mode = Literal["chat", "json", "tool"]
MODES: tuple[Mode, ...] = ("chat", "json", "tool")


class ModeError(RadixchatError):
    """A mode cannot be used as asked (bad schema, no tools, not available on this backend)."""


class UnenforceableSchemaError(ModeError):
    """Strict JSON mode refused a schema for what its constraint cannot enforce (an unsupported keyword,
    format or pattern construct, ``oneOf`` branches not provably disjoint). Lenient mode
    (``ConstraintSpec.lenient``) can run the schema, leaving that to the check of the finished reply."""


@dataclass(frozen=True, slots=True)
class ConstraintSpec:
    """What one reply is constrained to: the mode and what it takes.

    ``schema``: JSON mode's JSON Schema (None: any JSON object). ``tools``: tool mode's declarations (as
    ``Tool.schema()`` gives them), ``tool_choice`` (``auto``, ``required``, ``none`` or ``{"name": ...}``)
    and ``max_calls``, the calls one reply may make. ``lenient``: enforce what the grammar can of the
    schema and leave the rest to the check of the finished reply (``schema_check.schema_errors``) instead
    of refusing it."""

    mode: Mode
    schema: Any = None
    tools: list[dict] | None = None
    tool_choice: str | dict = "auto"
    lenient: bool = False
    max_calls: int = 1
