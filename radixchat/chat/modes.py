"""Conversation modes: ``chat`` (free text), ``json`` (JSON, optionally matching a schema), ``tool``
(free text or a call of one of the declared tools).

``grammar_for`` turns a mode into the constraint a backend applies to one reply: for the in-process
engine a fresh grammar matcher (the engine masks every token that cannot continue a valid output); for
a remote backend whatever its API takes. Compiling may take ~0.2 s the first time for a tokenizer (its
token table) and ~20 ms per new schema, so front ends call it off the event loop.
"""

from __future__ import annotations

import threading
from typing import Any, Literal

from radixchat.errors import RadixchatError

Mode = Literal["chat", "json", "tool"]
MODES: tuple[Mode, ...] = ("chat", "json", "tool")


class ModeError(RadixchatError):
    """A mode cannot be used as asked (bad schema, no tools, not available on this backend)."""


def grammar_for(
    backend: Any,
    mode: Mode,
    schema: Any = None,
    tools: list[dict] | None = None,
    tool_choice: str | dict = "auto",
) -> Any | None:
    """The constraint for one reply in ``mode`` (None: unconstrained). Raises ModeError."""
    if mode == "chat":
        return None
    if mode not in MODES:
        raise ModeError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    constraint = getattr(backend, "constraint", None)
    if constraint is None:
        raise ModeError(f"{mode} mode is not available with this backend")
    return constraint(mode, schema=schema, tools=tools, tool_choice=tool_choice)


class GrammarService:
    """Compiles grammars for one tokenizer; matchers are per reply, compiled grammars are cached."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_ids = eos_ids
        self._info: Any = None
        self._lock = threading.Lock()

    @property
    def info(self) -> Any:
        from radixchat.grammar import TokenizerInfo

        with self._lock:
            if self._info is None:
                self._info = TokenizerInfo.from_tokenizer(
                    self._tokenizer, vocab_size=self._vocab_size, eos_ids=sorted(self._eos_ids)
                )
            return self._info

    def matcher(self, mode: Mode, schema: Any = None, tools: list[dict] | None = None, tool_choice: str | dict = "auto") -> Any:
        from radixchat.grammar import GrammarError, compile_json_schema, compile_tool_call_grammar

        try:
            if mode == "json":
                return compile_json_schema(schema, self.info).matcher()
            if mode == "tool":
                if not tools:
                    raise ModeError("tool mode needs at least one declared tool")
                return compile_tool_call_grammar(tools, self.info, tool_choice=tool_choice).matcher()
        except GrammarError as exc:
            raise ModeError(f"{mode} mode: {exc}") from None
        raise ModeError(f"unknown mode '{mode}'")
