"""The seam between front ends (TUI, batch) and whatever generates replies.

``ChatBackend`` is what the TUI and batch mode use; ``LocalBackend`` runs the in-process engine. A remote
OpenAI-compatible backend implements the same protocol. A ``Reply`` streams text deltas, can be
cancelled, and on completion appends the assistant message — with the exact generated ids — to the
conversation, so the next turn is a pure prefix extension.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from radixchat.chat.conversation import ChatFormat, Conversation, Message, usage_footer
from radixchat.chat.modes import GrammarService, Mode
from radixchat.engine import Engine, EngineStats, FinishEvent, SamplingParams, TokenEvent, TokenMatcher


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

    @property
    def prefilled_tokens(self) -> int | None:
        if self.prompt_tokens is None or self.cached_tokens is None:
            return None
        return self.prompt_tokens - self.cached_tokens

    def usage(self) -> dict[str, int | None]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }

    def footer(self) -> str:
        return usage_footer(self.prompt_tokens, self.cached_tokens, self.ttft_ms, self.decode_tokens_per_s)


class Reply(Protocol):
    def __aiter__(self) -> AsyncIterator[str]: ...
    def cancel(self) -> None: ...
    async def result(self) -> TurnResult: ...


class ChatBackend(Protocol):
    model_name: str
    fmt: ChatFormat

    def new_conversation(
        self, system: str | None = None, tools: list[dict] | None = None
    ) -> Conversation: ...
    def reply(
        self, conv: Conversation, params: SamplingParams, grammar: TokenMatcher | None = None
    ) -> Reply: ...
    def stats(self) -> EngineStats | None: ...
    def cached_path(self, ids: Sequence[int]) -> list[int]: ...
    async def aclose(self) -> None: ...


class LocalReply:
    """One streaming reply from the in-process engine."""

    def __init__(self, conv: Conversation, handle: Any) -> None:
        self._conv = conv
        self._handle = handle
        self._ids: list[int] = []
        self._text: list[str] = []
        self._result: TurnResult | None = None
        self._done = asyncio.Event()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[str]:
        async for ev in self._handle:
            if isinstance(ev, TokenEvent):
                self._ids.append(ev.token_id)
            if ev.text:
                self._text.append(ev.text)
                yield ev.text
            if isinstance(ev, FinishEvent):
                self._finish(ev)

    def _finish(self, ev: FinishEvent) -> None:
        text = "".join(self._text)
        reason = ev.reason.value
        ttft_ms = ev.ttft_s * 1000 if ev.ttft_s is not None else None
        self._conv.add_assistant(
            text,
            self._ids,
            reason,
            usage=ev.usage.as_dict(),
            ttft_ms=ttft_ms,
            decode_tokens_per_s=ev.decode_tokens_per_s,
        )
        u = ev.usage
        self._result = TurnResult(
            self._conv.messages[-1],
            reason,
            u.prompt_tokens,
            u.cached_tokens,
            u.completion_tokens,
            ttft_ms,
            ev.decode_tokens_per_s,
            ev.error,
        )
        self._done.set()

    def cancel(self) -> None:
        self._handle.cancel()

    async def result(self) -> TurnResult:
        if self._result is None:
            async for _ in self:
                pass
        assert self._result is not None
        return self._result


class LocalBackend:
    """Chat over the in-process engine."""

    def __init__(self, engine: Engine, cache_dir: Path | None = None) -> None:
        self.engine = engine
        self.model_name = engine.model_name
        self.fmt = ChatFormat(engine.tokenizer)
        loaded = engine.loaded
        self.grammars = GrammarService(loaded.tokenizer, loaded.vocab_size, loaded.eos_ids, cache_dir)

    def new_conversation(self, system: str | None = None, tools: list[dict] | None = None) -> Conversation:
        return Conversation(self.fmt, system=system, tools=tools)

    def constraint(
        self,
        mode: Mode,
        *,
        schema: Any = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict = "auto",
        lenient: bool = False,
    ) -> TokenMatcher:
        """A fresh grammar matcher for one reply in ``mode`` (see ``modes.grammar_for``). Compiled on the
        engine's thread, like all torch work (see ``Engine``); blocks the caller until it is done."""
        return self.engine.call(self.grammars.matcher, mode, schema, tools, tool_choice, lenient)

    def reply(
        self, conv: Conversation, params: SamplingParams, grammar: TokenMatcher | None = None
    ) -> LocalReply:
        """Start generating the reply to the conversation's last message (raises RequestError).

        ``grammar`` is the constraint from ``modes.grammar_for`` (a matcher for this engine)."""
        handle = self.engine.submit(conv.prompt_ids(), params, grammar)
        return LocalReply(conv, handle)

    def warm(self, ids: Sequence[int]) -> None:
        """Prefill ``ids`` in the background (e.g. an opened session's history) so the next turn hits."""
        if len(ids) > 1:
            self.engine.prefill(ids)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def aclose(self) -> None:
        """Stop the engine and keep what the grammars learned for the next run."""
        await self.engine.stop()
        await asyncio.to_thread(self.grammars.save)

    def cached_path(self, ids: Sequence[int]) -> list[int]:
        """Tree node ids along ``ids`` (to highlight the current conversation in the cache panel)."""
        return self.engine.cached_path(ids)


def sampling_params(settings: Any, **overrides: Any) -> SamplingParams:
    """SamplingParams from a ``Settings`` (defaults) with per-session/per-line overrides (None = unset)."""
    names = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed")
    values = {n: getattr(settings, n) for n in names}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if "stop" in values:
        values["stop"] = tuple(values["stop"])
    return SamplingParams(**values)
