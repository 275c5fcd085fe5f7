"""Conversation modes: ``chat`` (free text), ``json`` (JSON, optionally matching a schema), ``tool``
(free text or a call of one of the declared tools).

``grammar_for`` turns a mode into the constraint a backend applies to one reply: for the in-process
engine a fresh grammar matcher (the engine masks every token that cannot continue a valid output); for
a remote backend whatever its API takes. Compiling may take ~0.2 s the first time for a tokenizer (its
token table) and ~20 ms per new schema, so front ends call it off the event loop.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Literal

from radixchat.errors import RadixchatError

log = logging.getLogger(__name__)

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
    lenient: bool = False,
) -> Any | None:
    """The constraint for one reply in ``mode`` (None: unconstrained). Raises ModeError.

    ``lenient``: schema keywords the grammar cannot enforce (``uniqueItems``, ``not``, ...) are left to
    a ``jsonschema`` check of the finished reply (``schema_check.schema_errors``) instead of refused."""
    if mode == "chat":
        return None
    if mode not in MODES:
        raise ModeError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    constraint = getattr(backend, "constraint", None)
    if constraint is None:
        raise ModeError(f"{mode} mode is not available with this backend")
    return constraint(mode, schema=schema, tools=tools, tool_choice=tool_choice, lenient=lenient)


class GrammarService:
    """Compiles grammars for one tokenizer; matchers are per reply, compiled grammars are cached.

    With a ``cache_dir``, the tokenizer's context-independent mask cache (which grows as grammars
    visit new lexer states) is loaded from ``<cache_dir>/grammar/masks-<vocabulary>.npz`` and saved back
    by ``save()``, so a machine warms it once rather than every run.
    """

    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_ids: frozenset[int], cache_dir: Path | None = None
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._eos_ids = eos_ids
        self._cache_dir = cache_dir
        self._info: Any = None
        self._loaded_states = 0
        self._lock = threading.Lock()

    @property
    def info(self) -> Any:
        from radixchat.grammar import TokenizerInfo

        with self._lock:
            if self._info is None:
                self._info = TokenizerInfo.from_tokenizer(
                    self._tokenizer, vocab_size=self._vocab_size, eos_ids=sorted(self._eos_ids)
                )
                path = self._cache_file()
                if path is not None and path.is_file():
                    try:
                        self._info.load_cache(path)
                    except Exception as exc:  # a stale or damaged cache only costs warm-up time
                        log.warning("ignoring the grammar mask cache %s: %s", path, exc)
                self._loaded_states = self._info.cached_states
            return self._info

    def _cache_file(self) -> Path | None:
        if self._cache_dir is None or self._info is None:
            return None
        return Path(self._cache_dir) / "grammar" / f"masks-{self._info.fingerprint}.npz"

    def save(self) -> None:
        """Write the mask cache back if grammars reached new states since it was loaded (atomic)."""
        with self._lock:
            path = self._cache_file()
            if path is None or self._info.cached_states <= self._loaded_states:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
            try:
                self._info.save_cache(tmp)
                os.replace(tmp, path)
                self._loaded_states = self._info.cached_states
            except OSError as exc:
                log.warning("cannot save the grammar mask cache %s: %s", path, exc)
                tmp.unlink(missing_ok=True)

    def matcher(
        self,
        mode: Mode,
        schema: Any = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict = "auto",
        lenient: bool = False,
    ) -> Any:
        from radixchat.grammar import (
            GrammarError,
            GrammarWarning,
            compile_json_schema,
            compile_tool_call_grammar,
        )

        try:
            if mode == "json":
                with warnings.catch_warnings():  # lenient: what it ignores is the grammar's not_enforced
                    warnings.simplefilter("ignore", GrammarWarning)
                    return compile_json_schema(schema, self.info, lenient=lenient).matcher()
            if mode == "tool":
                if not tools:
                    raise ModeError("tool mode needs at least one declared tool")
                grammar = compile_tool_call_grammar(
                    tools, self.info, tool_choice=tool_choice, lenient=lenient
                )
                return grammar.matcher()
        except GrammarError as exc:
            raise ModeError(f"{mode} mode: {exc}") from None
        raise ModeError(f"unknown mode '{mode}'")
