"""Chat over the in-process engine: the one chat module that imports the engine (and so torch).

``LocalBackend`` implements ``ChatBackend``: replies are engine requests over the conversation's exact
token ids, constraints are grammar matchers compiled for the engine's tokenizer, and the panels get the
engine's live stats and cache tree.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixchat.chat.backend import ChatBackend, LoadedKV, StoredKV, TurnResult
from radixchat.chat.conversation import ChatFormat, ContextOverflow, Conversation
from radixchat.chat.engine_settings import engine_from_settings
from radixchat.chat.modes import ConstraintSpec, ModeError, UnenforceableSchemaError
from radixchat.chat.thinking import THINK_CLOSE, THINK_OPEN, ThinkingSplitter, prompt_opens_thinking
from radixchat.chat.usage import UsageTotals
from radixchat.engine import (
    Engine,
    EngineStats,
    FinishEvent,
    RequestHandle,
    SamplingParams,
    TokenEvent,
    TokenMatcher,
)

if TYPE_CHECKING:
    from radixchat.config import Settings

log = logging.getLogger(__name__)


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
        self._runs: Any = None  # the tokenizer's ``RunCache``: the mask cache saved and loaded here
        self._loaded_states = 0
        self._lock = threading.Lock()

    @property
    def info(self) -> Any:
        from radixchat.grammar import RunCache, TokenizerInfo

        with self._lock:
            if self._info is None:
                self._info = TokenizerInfo.from_tokenizer(
                    self._tokenizer, vocab_size=self._vocab_size, eos_ids=sorted(self._eos_ids)
                )
                self._runs = RunCache.of(self._info)
                path = self._cache_file()
                if path is not None and path.is_file():
                    try:
                        self._runs.load_cache(path)
                    except Exception as exc:  # a stale or damaged cache only costs warm-up time
                        log.warning("ignoring the grammar mask cache %s: %s", path, exc)
                self._loaded_states = self._runs.cached_states
            return self._info

    def _cache_file(self) -> Path | None:
        if self._cache_dir is None or self._info is None:
            return None
        return Path(self._cache_dir) / "grammar" / f"masks-{self._info.fingerprint}.npz"

    def save(self) -> None:
        """Write the mask cache back if grammars reached new states since it was loaded (atomic)."""
        with self._lock:
            path = self._cache_file()
            if path is None or self._runs.cached_states <= self._loaded_states:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
            try:
                self._runs.save_cache(tmp)
                os.replace(tmp, path)
                self._loaded_states = self._runs.cached_states
            except OSError as exc:
                log.warning("cannot save the grammar mask cache %s: %s", path, exc)
                tmp.unlink(missing_ok=True)

    def matcher(self, spec: ConstraintSpec) -> TokenMatcher:
        """A fresh matcher for one reply as ``spec`` says (mode ``json`` or ``tool``). Raises ModeError."""
        from radixchat.grammar import (
            GrammarError,
            GrammarWarning,
            UnenforceableSchema,
            compile_json_schema,
            compile_tool_call_grammar,
        )

        mode = spec.mode
        try:
            if mode == "json":
                with warnings.catch_warnings():  # lenient: what it ignores is the grammar's not_enforced
                    warnings.simplefilter("ignore", GrammarWarning)
                    return compile_json_schema(spec.schema, self.info, lenient=spec.lenient).matcher()
            if mode == "tool":
                if not spec.tools:
                    raise ModeError("tool mode needs at least one declared tool")
                grammar = compile_tool_call_grammar(
                    spec.tools,
                    self.info,
                    tool_choice=spec.tool_choice,
                    lenient=spec.lenient,
                    max_calls=spec.max_calls,
                )
                return grammar.matcher()
        except UnenforceableSchema as exc:
            raise UnenforceableSchemaError(f"{mode} mode: {exc}") from None
        except GrammarError as exc:
            raise ModeError(f"{mode} mode: {exc}") from None
        raise ModeError(f"unknown mode '{mode}'")


class LocalReply:
    """One streaming reply from the in-process engine."""

    def __init__(
        self,
        backend: LocalBackend,
        conv: Conversation,
        handle: RequestHandle,
        dropped_turns: int = 0,
        thinking: ThinkingSplitter | None = None,
    ) -> None:
        """``thinking``: the splitter of a model that thinks (None: all the text is answer)."""
        self._backend = backend
        self._conv = conv
        self._handle = handle
        self._dropped = dropped_turns
        self._split = thinking
        self._thought = 0  # tokens generated while thinking (the tags included)
        self._ids: list[int] = []
        self._text: list[str] = []
        self._result: TurnResult | None = None

    def __aiter__(self) -> AsyncIterator[str]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[str]:
        split = self._split
        async for ev in self._handle:
            if isinstance(ev, TokenEvent):
                self._ids.append(ev.token_id)
            was_thinking = split is not None and split.in_thinking
            if ev.text:
                self._text.append(ev.text)
                for delta in split.feed(ev.text) if split is not None else (ev.text,):
                    yield delta
            if isinstance(ev, TokenEvent) and (was_thinking or (split is not None and split.in_thinking)):
                self._thought += 1
            if isinstance(ev, FinishEvent):
                for delta in split.flush() if split is not None else ():
                    yield delta
                self._finish(ev)

    def _finish(self, ev: FinishEvent) -> None:
        text = "".join(self._text)
        reasoning, thought = None, None
        if self._split is not None and self._split.opened:
            text, reasoning, thought = self._split.answer, self._split.reasoning, self._thought
        reason = ev.reason.value
        ttft_ms = ev.ttft_s * 1000 if ev.ttft_s is not None else None
        usage: dict[str, int] = ev.usage.as_dict()
        if thought is not None:
            usage["reasoning_tokens"] = thought
        self._conv.add_assistant(
            text,
            self._ids,
            reason,
            reasoning,
            usage=usage,
            ttft_ms=ttft_ms,
            decode_tokens_per_s=ev.decode_tokens_per_s,
            model=self._backend.model_name,
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
            self._dropped,
            thought,
        )
        self._backend.replies += 1

    def cancel(self) -> None:
        self._handle.cancel()

    async def result(self) -> TurnResult:
        if self._result is None:
            async for _ in self:
                pass
        assert self._result is not None
        return self._result


class LocalBackend(ChatBackend):
    """Chat over the in-process engine."""

    def __init__(
        self,
        engine: Engine,
        cache_dir: Path | None = None,
        context_overflow: ContextOverflow = "drop-oldest",
        max_thinking_tokens: int = 1024,
        chat_template: str = "auto",
    ) -> None:
        self.engine = engine
        self.context_overflow = context_overflow
        self.max_thinking_tokens = max_thinking_tokens
        self.model_name = engine.model_name
        loaded = engine.loaded
        model_type = getattr(loaded.model.config, "model_type", None)
        self.fmt = ChatFormat(engine.tokenizer, chat_template, model_type, loaded.eos_ids)
        self.context_tokens = engine.context_tokens
        self.grammars = GrammarService(loaded.tokenizer, loaded.vocab_size, loaded.eos_ids, cache_dir)
        self.replies = 0  # replies finished (the engine counts requests, warm-ups included)

    @classmethod
    def from_settings(cls, settings: Settings, progress: Callable[[str], None] | None = None) -> LocalBackend:
        """Load the model ``settings`` name and build its engine (blocking: run it in a thread)."""
        return cls(
            engine_from_settings(settings, progress),
            cache_dir=settings.cache_dir,
            context_overflow=settings.context_overflow,
            max_thinking_tokens=settings.max_thinking_tokens,
            chat_template=settings.chat_template,
        )

    @property
    def notices(self) -> tuple[str, ...]:
        return (self.fmt.notice,) if self.fmt.notice else ()

    async def start(self) -> None:
        await self.engine.start()

    def new_conversation(self, system: str | None = None, tools: list[dict] | None = None) -> Conversation:
        return Conversation(self.fmt, system=system, tools=tools)

    def constraint(self, spec: ConstraintSpec) -> TokenMatcher:
        """A fresh grammar matcher for one reply as ``spec`` says (see ``backend.grammar_for``). Compiled
        on the engine's thread, like all torch work (see ``Engine``); blocks the caller until it is done."""
        return self.engine.call(self.grammars.matcher, spec)

    def reply(
        self, conv: Conversation, params: SamplingParams, constraint: TokenMatcher | None = None
    ) -> LocalReply:
        """Start generating the reply to the conversation's last message (raises RequestError).

        ``constraint`` is the grammar matcher from ``constraint()`` (a matcher for this engine). A model
        that thinks thinks unconstrained: the grammar applies from its closing tag on (``after_thinking``).
        """
        context = self.context_tokens
        dropped = conv.fit_context(context, min(params.max_tokens, context // 4), self.context_overflow)
        prompt = conv.prompt_ids()
        splitter = None
        if self.fmt.thinks:
            inside = prompt_opens_thinking(conv.text)
            splitter = ThinkingSplitter(inside)
            if constraint is not None:
                constraint = self._after_thinking(constraint, inside)
        handle = self.engine.submit(prompt, params, constraint)
        return LocalReply(self, conv, handle, dropped, splitter)

    def _after_thinking(self, matcher: TokenMatcher, inside: bool) -> TokenMatcher:
        """``matcher`` behind the thinking, where the tags are tokens of this vocabulary (else as is)."""
        from radixchat.grammar.thinking import ThinkingMatcher

        vocab = self.engine.tokenizer.get_vocab()
        open_id, close_id = vocab.get(THINK_OPEN), vocab.get(THINK_CLOSE)
        if open_id is None or close_id is None:
            return matcher
        loaded = self.engine.loaded
        return ThinkingMatcher(
            matcher,
            loaded.vocab_size,
            open_id,
            close_id,
            loaded.eos_ids,
            self.max_thinking_tokens,
            inside,
        )

    def warm(self, ids: Sequence[int]) -> None:
        if len(ids) > 1:
            self.engine.prefill(ids)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    @property
    def has_kv_store(self) -> bool:
        return self.engine.kv_store_on

    def save_kv(self, ids: Sequence[int], owner: str) -> StoredKV | None:
        if not self.has_kv_store:
            return None
        r = self.engine.save_kv(ids, owner)
        return StoredKV(r.tokens, r.written_bytes, r.notice)

    def load_kv(self, ids: Sequence[int]) -> LoadedKV:
        r = self.engine.load_kv(ids)
        return LoadedKV(r.cached_tokens, r.loaded_tokens, tuple(r.notices))

    # Usage, delete and rename touch only files: a disk error there is logged and answered as "none",
    # since the session files they follow have already been handled by then.

    def kv_usage(self) -> dict[str, StoredKV]:
        try:
            usage = self.engine.kv_store_usage()
        except OSError as exc:
            log.warning("cannot read the KV store: %s", exc)
            return {}
        if usage is None:
            return {}
        return {owner: StoredKV(u.tokens, u.bytes) for owner, u in usage.owners.items()}

    def delete_kv(self, owner: str) -> int:
        try:
            return self.engine.delete_kv(owner)
        except OSError as exc:
            log.warning("cannot delete the stored KV of %s: %s", owner, exc)
            return 0

    def rename_kv(self, old: str, new: str) -> bool:
        try:
            return self.engine.rename_kv(old, new)
        except OSError as exc:
            log.warning("cannot rename the stored KV of %s: %s", old, exc)
            return False

    def cached_path(self, ids: Sequence[int]) -> list[int]:
        return self.engine.cached_path(ids)

    def totals(self) -> UsageTotals:
        """From the engine's counters (warm-up prefills included, as they use the cache too)."""
        s = self.engine.stats(tree=False)
        return UsageTotals(
            turns=self.replies,
            prompt_tokens=s.prompt_tokens,
            cached_tokens=s.cached_tokens,
            completion_tokens=s.generated_tokens,
            cache_reports=self.replies,
            hit_rate=s.hit_rate,
        )

    async def aclose(self) -> None:
        """Stop the engine and keep what the grammars learned for the next run."""
        await self.engine.stop()
        await asyncio.to_thread(self.grammars.save)
