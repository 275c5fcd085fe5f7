"""The link to one OpenAI-compatible server: what a remote reply needs of its backend, and nothing else.

``RemoteBackend`` (``remote.py``) owns a ``ServerLink``; each ``RemoteReply`` (``remote_reply.py``) gets
it. The link holds the HTTP client (created in the first event loop that uses it), the limits (timeout,
retries, backoff, concurrent requests), what was learnt about the server (the ``response_format`` form it
takes), the usage totals, and how to put a failure in one line. Replies never touch the backend.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixchat.chat.usage import UsageTotals

if TYPE_CHECKING:
    import openai

    from radixchat.chat.backend import TurnResult


@dataclass(slots=True)
class RemoteTotals:
    """Counters over all finished replies (the remote stand-in for the engine's hit-rate stats)."""

    turns: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cache_reports: int = 0  # turns whose usage included cached tokens

    @property
    def hit_rate(self) -> float | None:
        """Cached / prompt tokens over the turns that reported both (None: the server reports none)."""
        return self.cached_tokens / self.prompt_tokens if self.cache_reports and self.prompt_tokens else None

    def add(self, result: TurnResult) -> None:
        self.turns += 1
        self.completion_tokens += result.completion_tokens
        if result.prompt_tokens is not None and result.cached_tokens is not None:
            self.prompt_tokens += result.prompt_tokens
            self.cached_tokens += result.cached_tokens
            self.cache_reports += 1

    def snapshot(self) -> UsageTotals:
        return UsageTotals(
            self.turns,
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            self.cache_reports,
            self.hit_rate,
        )


@dataclass(eq=False)
class ServerLink:
    """One server: its URL and key, the client, the limits, and what was learnt about it."""

    base_url: str
    api_key: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 0.5
    max_concurrent: int = 32
    # "json_schema" (OpenAI's form), or "json_object" with a schema (llama-cpp-python's), learnt on refusal.
    json_schema_style: str = "json_schema"
    totals: RemoteTotals = field(default_factory=RemoteTotals)
    _slots: asyncio.Semaphore | None = None
    _client: openai.AsyncOpenAI | None = None

    def new_client(self) -> openai.AsyncOpenAI:
        import openai

        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=self.api_key or "EMPTY",  # servers without auth ignore it; the client needs one
            timeout=openai.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s)),
            max_retries=0,
        )

    @property
    def client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            self._client = self.new_client()
        return self._client

    @property
    def slots(self) -> asyncio.Semaphore:
        """At most ``max_concurrent`` requests in flight (made in the event loop that first asks)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        return self._slots

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def json_schema_format(self, schema: dict) -> dict[str, Any]:
        """``response_format`` for replies that follow ``schema``, in the form this server takes."""
        if self.json_schema_style == "json_object":
            return {"type": "json_object", "schema": schema}
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}

    def describe(self, exc: BaseException, *, model: str, during: str = "", tries: int = 1) -> str:
        """One line for a failed request: what the server said, where, and what to do."""
        import openai

        where = f" ({during})" if during else ""
        where += f" after {tries} tries" if tries > 1 else ""
        url = self.base_url
        if isinstance(exc, openai.APITimeoutError):
            return f"no reply from {url} within {self.timeout_s:g} s{where} (--remote-timeout)"
        if isinstance(exc, openai.APIConnectionError):
            cause = cause_text(exc)
            return f"cannot reach {url}{where}: {cause}" if cause else f"cannot reach {url}{where}"
        if isinstance(exc, openai.APIStatusError):
            status, said = exc.status_code, server_message(exc)
            said_note = f": {said}" if said else ""
            if status == 401:
                key = (
                    f"check ${self.api_key_env}"
                    if self.api_key
                    else f"set ${self.api_key_env} (or name another variable with --api-key-env)"
                )
                return f"{url} refused the API key (401 Unauthorized){where}; {key}"
            if status == 403:
                return f"{url} does not allow this API key (403 Forbidden){where}{said_note}"
            if status == 404 and during == "listing models":
                return (
                    f"{url} answered 404 Not Found{where}: the URL probably lacks its API path (usually /v1)"
                )
            if status == 404:
                return (
                    f"{url} answered 404 Not Found{where}: model '{model}' is unknown there, or the URL "
                    f"lacks its API path (usually /v1); see radixchat --backend {url} --list-models"
                )
            if status == 429:
                return f"{url} is overloaded (429 Too Many Requests){where}{said_note}"
            if status >= 500:
                return f"{url} failed with a server error ({status}){where}{said_note}"
            return f"{url} rejected the request ({status}){where}{said_note}"
        if isinstance(exc, openai.APIError):
            return f"{url} reported an error{where}: {one_line(exc.message)}"
        return f"{url}{where}: {one_line(str(exc))}"


def server_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    text: Any = body
    if isinstance(body, dict):
        text = body.get("message") or body.get("detail") or body.get("error") or body
    if isinstance(text, dict):
        text = text.get("message") or json.dumps(text)
    if isinstance(text, list):  # FastAPI validation details
        text = "; ".join(str(e.get("msg", e)) if isinstance(e, dict) else str(e) for e in text[:3])
    return one_line(str(text)) if text else ""


def cause_text(exc: BaseException) -> str:
    cause = exc.__cause__
    while cause is not None and cause.__cause__ is not None and not str(cause):
        cause = cause.__cause__
    return one_line(str(cause)) if cause is not None and str(cause) else ""


def one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
