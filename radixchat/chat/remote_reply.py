"""One streaming reply from an OpenAI-compatible server (see ``remote.py`` for the backend).

A task reads the SSE stream from the moment the reply is created and feeds a queue the consumer iterates;
``cancel()`` cancels the task, which closes the HTTP stream. Before the first token, what may pass is
retried with backoff: connection errors (not a read timeout: the server has the request), 408, 409, 429
and 5xx. A stream that ends cleanly before its first token without a finish reason is sent again once:
llama-cpp-python's server (unless started with ``--interrupt_requests False``) ends a running stream
that way when another request arrives. After the first token, a broken stream ends the reply with an
error and the partial text kept. The reply knows its server only through the backend's ``ServerLink``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

from radixchat.chat.backend import TurnResult
from radixchat.chat.conversation import Conversation
from radixchat.chat.remote_link import ServerLink, one_line, server_message
from radixchat.chat.thinking import ThinkingDelta, ThinkingSplitter
from radixchat.errors import RemoteError

_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
_MAX_RETRY_AFTER_S = 30.0
_FINISH = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "function_call": "stop",
    "content_filter": "stop",
}
_END = object()  # queue sentinel


class RemoteReply:
    """One streaming reply from a remote server. A task reads the SSE stream into a queue from the moment
    the reply is created; ``cancel()`` cancels that task, which closes the HTTP stream (the server sees
    the client go and stops generating). When the task ends, the assistant message (``token_ids=[]``) is
    appended to the conversation."""

    def __init__(self, link: ServerLink, conv: Conversation, request: dict[str, Any]) -> None:
        self._link = link
        self._conv = conv
        self._request = request
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._drained = False
        self._cancel_requested = False
        self._result: TurnResult | None = None
        self._bug: BaseException | None = None
        # What the stream brought so far.
        self._text: list[str] = []
        self._split = ThinkingSplitter()  # a server without a reasoning parser sends <think> in content
        self._reasoning: list[str] = []  # what it sent as ``reasoning_content`` (or ``reasoning``)
        self._thought_chunks = 0  # ≈ thinking tokens, when usage does not report them
        self._calls: dict[int, dict[str, Any]] = {}
        self._chunks = 0  # chunks with content or tool-call deltas (≈ tokens, when usage is not reported)
        self._usage: Any = None
        self._finish_reason: str | None = None
        self._t_submit = time.perf_counter()
        self._t_first: float | None = None
        self._t_last: float | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._on_done)

    # -- the consumer side -------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[str]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[str]:
        while not self._drained:
            item = await self._queue.get()
            if item is _END:
                self._drained = True
                break
            yield item
        if self._bug is not None:
            raise self._bug

    def cancel(self) -> None:
        """Stop the reply; what arrived so far is kept (finish reason ``cancelled``)."""
        if not self._task.done():
            self._cancel_requested = True
            self._task.cancel()

    async def result(self) -> TurnResult:
        async for _ in self:
            pass
        assert self._result is not None
        return self._result

    # -- the producer task -------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            async with self._link.slots:
                await self._stream_with_retries()
        except asyncio.CancelledError:
            if not self._cancel_requested:
                raise
            self._finish("cancelled")
            return
        except RemoteError as exc:
            self._finish("error", str(exc))
            return
        if self._finish_reason is None:
            self._finish("error", self._lost("ended the stream before the reply was finished"))
        else:
            self._finish(_FINISH.get(self._finish_reason, "stop"))

    async def _stream_with_retries(self) -> None:
        """Open the stream and read it; before any output, retry what may pass (see module docstring)."""
        import openai

        link = self._link
        attempt = 0
        resent = False  # a stream cut before its first token was sent again (once)
        while True:
            self._usage, self._finish_reason = None, None
            try:
                stream = await link.client.chat.completions.create(**self._request)
                try:
                    async for chunk in stream:
                        self._on_chunk(chunk)
                finally:
                    await stream.close()
            except openai.APIError as exc:
                if self._t_first is not None:
                    raise RemoteError(self._broken(exc)) from None
                if _may_refuse_json_schema(exc) and self._use_json_object_form():
                    continue
                if attempt >= link.retries or not _retryable(exc):
                    raise RemoteError(self._describe(exc, tries=attempt + 1)) from None
                await asyncio.sleep(_backoff(exc, attempt, link.backoff_s))
                attempt += 1
                continue
            if self._finish_reason is None and self._t_first is None and not resent:
                resent = True
                continue
            return

    def _describe(self, exc: BaseException, tries: int) -> str:
        return self._link.describe(exc, model=self._request.get("model", ""), tries=tries)

    def _use_json_object_form(self) -> bool:
        """llama-cpp-python refuses ``json_schema`` but takes ``{"type": "json_object", "schema": ...}``: switch
        to that form (once per server) and say whether to try again."""
        fmt = self._request.get("response_format")
        if not fmt or fmt.get("type") != "json_schema":
            return False
        self._link.json_schema_style = "json_object"
        self._request["response_format"] = self._link.json_schema_format(fmt["json_schema"]["schema"])
        return True

    def _on_chunk(self, chunk: Any) -> None:
        if getattr(chunk, "usage", None) is not None:
            self._usage = chunk.usage
        for choice in chunk.choices or ():
            delta = choice.delta
            # Not in the OpenAI API: vLLM and SGLang send ``reasoning_content``, some servers ``reasoning``.
            thought = delta is not None and (
                getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None)
            )
            if delta is not None and (delta.content or delta.tool_calls or thought):
                now = time.perf_counter()
                self._t_first = self._t_first or now
                self._t_last = now
                self._chunks += 1
                if thought and isinstance(thought, str):
                    self._reasoning.append(thought)
                    self._thought_chunks += 1
                    self._queue.put_nowait(ThinkingDelta(thought))
                if delta.content:
                    self._text.append(delta.content)
                    for piece in self._split.feed(delta.content):
                        self._queue.put_nowait(piece)
                for tc in delta.tool_calls or ():
                    call = self._calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                    call["id"] = tc.id or call["id"]
                    if tc.function is not None:
                        # OpenAI sends the name once; llama.cpp's server repeats it in every chunk.
                        name = tc.function.name or ""
                        if name != call["name"]:
                            call["name"] += name
                        call["arguments"] += tc.function.arguments or ""
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason

    def _broken(self, exc: BaseException) -> str:
        import openai

        if isinstance(exc, openai.APITimeoutError):
            return self._lost(f"went silent for {self._link.timeout_s:g} s mid-reply")
        if isinstance(exc, openai.APIConnectionError):
            return self._lost("closed the connection mid-reply")
        return self._lost(f"failed mid-reply: {server_message(exc) or one_line(str(exc))}")

    def _lost(self, what: str) -> str:
        kept = "; the partial reply is kept" if self._text or self._calls or self._reasoning else ""
        return f"the server at {self._link.base_url} {what}{kept}"

    def _finish(self, reason: str, error: str | None = None) -> None:
        for piece in self._split.flush():
            self._queue.put_nowait(piece)
        usage = self._usage
        prompt = getattr(usage, "prompt_tokens", None)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
        thought = getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None)
        if thought is None and self._reasoning:
            thought = self._thought_chunks
        reasoning = "".join(self._reasoning).strip() or self._split.reasoning
        if completion is None:
            completion = self._chunks
        if reason == "stop" and self._calls and completion >= self._request.get("max_tokens", 1 << 62):
            reason = "length"  # some servers say "tool_calls" for a call cut by max_tokens: never run it
        ttft_ms = (self._t_first - self._t_submit) * 1000 if self._t_first is not None else None
        tps = None
        if (
            self._t_first is not None
            and self._t_last is not None
            and completion > 1
            and self._t_last > self._t_first
        ):
            tps = (completion - 1) / (self._t_last - self._t_first)
        reported = {
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": completion,
            "reasoning_tokens": thought,
        }
        self._conv.add_assistant(
            self._split.answer,
            [],
            reason,
            reasoning,
            usage={k: v for k, v in reported.items() if v is not None},
            ttft_ms=ttft_ms,
            decode_tokens_per_s=tps,
            model=self._request.get("model"),
        )
        msg = self._conv.messages[-1]
        if self._calls:
            calls = [self._calls[i] for i in sorted(self._calls)]
            msg.tool_calls = [{"name": c["name"], "arguments": _arguments(c["arguments"])} for c in calls]
            msg.meta["tool_call_ids"] = [c["id"] or f"call_{i}" for i, c in enumerate(calls)]
        if error is not None:
            msg.meta["error"] = error
            if self._text or self._calls or self._reasoning:
                msg.meta["partial"] = True
        self._result = TurnResult(
            msg, reason, prompt, cached, completion, ttft_ms, tps, error, reasoning_tokens=thought
        )
        self._link.totals.add(self._result)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        try:
            if task.cancelled():
                if self._result is None:  # cancelled before it ran
                    self._finish("cancelled")
            elif task.exception() is not None:  # a bug: re-raised to whoever reads the reply
                self._bug = task.exception()
                if self._result is None:
                    self._finish("error", f"internal error: {self._bug}")
        finally:
            self._queue.put_nowait(_END)  # never leave a reader waiting


def _retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, openai.APITimeoutError):
        # A connect or pool timeout never reached the server; a read timeout means it has the request.
        return not _is_read_timeout(exc)
    if isinstance(exc, openai.APIConnectionError):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code in _RETRY_STATUS


def _may_refuse_json_schema(exc: BaseException) -> bool:
    """A refusal that may be of ``response_format`` ``json_schema``: any 400/422, or a server error that
    names it (llama-cpp-python answers its validation error with a 500)."""
    import openai

    if not isinstance(exc, openai.APIStatusError):
        return False
    return exc.status_code in (400, 422) or "response_format" in server_message(exc)


def _is_read_timeout(exc: BaseException) -> bool:
    return type(exc.__cause__).__name__ == "ReadTimeout"  # httpx's or httpx2's, whichever openai uses


def _backoff(exc: BaseException, attempt: int, base_s: float) -> float:
    """The server's Retry-After (capped) if it sent one, else exponential backoff with jitter."""
    response = getattr(exc, "response", None)
    header = response.headers.get("retry-after") if response is not None else None
    if header is not None:
        with contextlib.suppress(ValueError):
            return max(0.0, min(float(header), _MAX_RETRY_AFTER_S))
    return min(base_s * 2**attempt, 8.0) * (1 - 0.25 * random.random())


def _arguments(text: str) -> Any:
    """A streamed call's arguments: the JSON object, or the raw text if it does not parse (the tool
    registry then reports the invalid arguments to the model like any other bad call)."""
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return text
