"""The seam between front ends (the app, batch mode) and whatever generates replies.

``ChatBackend`` is everything a front end may use of a backend: front ends call these members and nothing
else (no ``getattr`` probing, no ``isinstance`` on an implementation). Two implementations:
``radixchat.chat.local.LocalBackend`` runs the in-process engine (the only chat module that imports it),
``radixchat.chat.remote.RemoteBackend`` talks to an OpenAI-compatible server. This module, ``TurnResult``
and the remote path import neither torch nor transformers.

A ``Reply`` streams text deltas, can be cancelled, and on completion appends the assistant message (with
the exact generated ids, when the backend has them) to the conversation, so the next turn is a pure
prefix extension.

To give front ends a new capability, add a member here with a docstring saying its contract, and a
default that is right for a backend without it (as ``warm`` and ``stats`` have), so that every backend,
test doubles included, keeps working until it implements it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from radixchat.chat.conversation import ChatFormat, ContextOverflow, Conversation, Message
from radixchat.chat.modes import MODES, ConstraintSpec, ModeError
from radixchat.chat.usage import UsageTotals, decorate_footer, usage_footer, with_model
from radixchat.sampling import SamplingParams

if TYPE_CHECKING:
    from radixchat.engine.stats import EngineStats


class MatcherConstraint(Protocol):
    """The in-process engine's constraint: a grammar matcher fed each generated token (the engine's
    ``TokenMatcher``, which the chat layer does not import)."""

    def advance(self, token_id: int) -> None: ...
    def is_accepting(self) -> bool: ...
    def is_terminated(self) -> bool: ...


# A remote server's constraint: the request fields its API takes (``response_format``, ``tools``, ...).
RequestFields = dict[str, Any]

# What a backend applies to one reply to constrain it (``ChatBackend.constraint``). Opaque to front ends:
# they pass it back to the backend that made it.
Constraint = MatcherConstraint | RequestFields


@dataclass(slots=True)
class TurnResult:
    message: Message
    finish_reason: str  # stop | length | cancelled | error
    # None only from a remote server that does not report them (the local engine always knows).
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int
    ttft_ms: float | None
    decode_tokens_per_s: float | None
    error: str | None = None
    dropped_turns: int = 0  # earlier turns that left the context before this reply (``fit_context``)
    # Of ``completion_tokens``, those the model spent thinking (None: it did not think, or the server
    # does not say). The answer is ``message.content``, the thinking ``message.reasoning``.
    reasoning_tokens: int | None = None

    @property
    def prefilled_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens

    def usage(self) -> dict[str, int | None]:
        """The counts (``reasoning_tokens`` only for a reply that thought)."""
        out: dict[str, int | None] = {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }
        if self.reasoning_tokens is not None:
            out["reasoning_tokens"] = self.reasoning_tokens
        return out

    def footer(self) -> str:
        """The usage line: ``reused 812 · prefilled 15 · TTFT 95 ms · 31 tok/s`` (with ``thinking N ·
        answer M`` for a reply that thought)."""
        return usage_footer(
            self.prompt_tokens,
            self.cached_tokens,
            self.ttft_ms,
            self.decode_tokens_per_s,
            self.reasoning_tokens,
            self.completion_tokens,
        )

    def status_footer(self) -> str:
        """The usage line with how the reply ended (stopped, cut by max tokens, cut off, an error), as the
        app shows under a reply."""
        meta = self.message.meta
        footer = decorate_footer(self.footer(), self.finish_reason, self.error, bool(meta.get("partial")))
        return with_model(footer, meta.get("model"))


@dataclass(frozen=True, slots=True)
class StoredKV:
    """What a backend's KV store holds for one owner (a saved session), or what a save stored."""

    tokens: int  # tokens of the owner's path whose KV is on disk (0: none)
    bytes: int  # disk bytes those take (blocks shared with other owners count for each)
    notice: str | None = None  # a save's one-line note on what it could not store (disk full, ...)


@dataclass(frozen=True, slots=True)
class LoadedKV:
    """What ``load_kv`` found: tokens already in the cache, tokens loaded from disk now, and a line per
    damaged or foreign file skipped (its tokens are computed instead)."""

    cached_tokens: int = 0
    loaded_tokens: int = 0
    notices: tuple[str, ...] = ()


def kv_owner(session_file: Path) -> str:
    """The owner name a session's stored KV goes under: its file's absolute path."""
    return str(Path(session_file).resolve())


class Reply(Protocol):
    """One reply being generated. Iterate it for text deltas; ``result()`` waits for the end (iterating
    what is left) and returns the ``TurnResult`` whose message is now the conversation's last. A thinking
    model's reasoning arrives as ``ThinkingDelta`` deltas (a ``str`` subclass, ``chat.thinking``), before
    the answer's plain ``str`` ones."""

    def __aiter__(self) -> AsyncIterator[str]: ...
    def cancel(self) -> None:
        """Stop generating; what came so far is kept (finish reason ``cancelled``)."""
        ...

    async def result(self) -> TurnResult: ...


class ChatBackend(ABC):
    """What front ends use of a backend. Build one with ``radixchat.chat.loading.load_backend``."""

    model_name: str
    # Renders and tokenizes messages (``ChatFormat``); a remote backend's stand-in renders nothing.
    fmt: ChatFormat
    # The server's URL; None for the in-process engine.
    base_url: str | None = None
    # Why the cache tree cannot be shown (it lives on the server); None when ``stats()`` has it.
    cache_tree_note: str | None = None
    # The most tokens a conversation and its reply may hold (None: not known here, as for most servers).
    # ``reply`` keeps each conversation within it (``Conversation.fit_context``), by ``context_overflow``
    # unless the conversation sets its own.
    context_tokens: int | None = None
    context_overflow: ContextOverflow = "drop-oldest"
    # One-line notices about choices made at load time for the user (a chat template chosen for a model
    # that ships none); front ends show them once the backend is up.
    notices: tuple[str, ...] = ()

    async def start(self) -> None:  # noqa: B027  (a default, not a stub: most backends have nothing to start)
        """Begin serving (the in-process engine starts its thread). Called once, on the event loop."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stop serving and release what the backend holds (the engine, HTTP connections)."""

    @abstractmethod
    def new_conversation(self, system: str | None = None, tools: list[dict] | None = None) -> Conversation:
        """An empty conversation in this backend's format (with ``system`` as its first message)."""

    def constraint(self, spec: ConstraintSpec) -> Constraint:
        """A fresh constraint for one reply as ``spec`` says (mode ``json`` or ``tool``; see
        ``grammar_for``). May block for a while (compiling a grammar): call it off the event loop.
        Raises ModeError: ``UnenforceableSchemaError`` where strict JSON mode refuses a schema that
        lenient mode could run."""
        raise ModeError(f"{spec.mode} mode is not available with this backend")

    @abstractmethod
    def reply(
        self, conv: Conversation, params: SamplingParams, constraint: Constraint | None = None
    ) -> Reply:
        """Start generating the reply to the conversation's last (user or tool) message. First, where
        ``context_tokens`` is known, the conversation is fitted to it (``fit_context``: earlier turns may
        leave the context; the result's ``dropped_turns`` says how many). Raises RadixchatError
        (ContextOverflowError, a refused request) with the conversation's messages all kept."""

    def count_tokens(self, text: str) -> int | None:
        """How many tokens ``text`` takes in this backend's vocabulary (an attachment's size before it is
        sent); None where that is not known here (a remote server tokenizes). Blocks for the tokenizer's
        time on long texts: call it off the event loop for those."""
        return len(self.fmt.encode(text))

    def warm(self, ids: Sequence[int]) -> None:  # noqa: B027  (a default: nothing to warm)
        """Prefill ``ids`` in the background (an opened session's history), so the next turn hits."""

    def stats(self) -> EngineStats | None:
        """The engine's live stats for the panels (None: no engine here, see ``totals``). Takes a lock the
        engine holds while scheduling: call it off the event loop."""
        return None

    def cached_path(self, ids: Sequence[int]) -> list[int]:
        """Ids of the cache-tree nodes along ``ids`` (to highlight the conversation in the tree panel)."""
        return []

    # -- the KV store on disk: saved sessions come back warm ------------------------------------------
    # Owners are ``kv_owner(session file)``. All of these block for disk time: call them off the event
    # loop. A backend without a store (a remote server, the store switched off) keeps these defaults.

    @property
    def has_kv_store(self) -> bool:
        """Whether ``save_kv`` stores anything (the sessions browser shows warm sessions only then)."""
        return False

    def save_kv(self, ids: Sequence[int], owner: str) -> StoredKV | None:
        """Store the KV of ``ids`` (a saved session's active path) for ``owner``, replacing what it had.
        Best effort: never raises; ``notice`` says what was not stored. Save the session file first.
        None: no store here."""
        return None

    def load_kv(self, ids: Sequence[int]) -> LoadedKV:
        """Load the longest stored prefix of ``ids`` into the cache (an opened session), so the next
        turn prefills only what follows. Never raises for a bad file (see ``LoadedKV.notices``)."""
        return LoadedKV()

    def kv_usage(self) -> dict[str, StoredKV]:
        """Per owner, the KV on disk for this backend's model (empty: none, or no store)."""
        return {}

    def delete_kv(self, owner: str) -> int:
        """Delete ``owner``'s stored KV (a deleted session). Returns the bytes freed."""
        return 0

    def rename_kv(self, old: str, new: str) -> bool:
        """Move ``old``'s stored KV to ``new`` (a renamed session). Returns whether there was any."""
        return False

    async def list_models(self) -> list[str]:
        """The models a server serves (the chat app's model picker offers them; switching to one asks the
        same server for it). Empty for the in-process engine: its models are files (``model_catalog``).
        Raises BackendUnavailableError."""
        return []

    @abstractmethod
    def totals(self) -> UsageTotals:
        """Usage over every reply so far (the batch summary, and the panels without engine stats)."""


def grammar_for(backend: ChatBackend, spec: ConstraintSpec) -> Constraint | None:
    """The constraint for one reply as ``spec`` says (None: unconstrained chat). Compiling a grammar takes
    a while the first time for a tokenizer (its token table) and for each new schema, so front ends call
    it off the event loop. Raises ModeError.

    ``spec.lenient``: schema keywords the grammar cannot enforce (``uniqueItems``, ``not``, ...) are left
    to a ``jsonschema`` check of the finished reply (``schema_check.schema_errors``) instead of refused."""
    if spec.mode == "chat":
        return None
    if spec.mode not in MODES:
        raise ModeError(f"unknown mode '{spec.mode}' (choose from {', '.join(MODES)})")
    return backend.constraint(spec)


def sampling_params(settings: Any, **overrides: Any) -> SamplingParams:
    """SamplingParams from a ``Settings`` (defaults) with per-session/per-line overrides (None = unset)."""
    names = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed", "stop")
    values = {n: getattr(settings, n) for n in names}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "stop" in values:
        values["stop"] = tuple(values["stop"])
    return SamplingParams(**values)
