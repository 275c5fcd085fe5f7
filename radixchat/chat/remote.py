"""Chat over an OpenAI-compatible server (SGLang, vLLM, llama.cpp's server) instead of the in-process engine.

``RemoteBackend`` implements the same protocol as ``LocalBackend``; front ends do not know which one they
hold. What differs, and why:

- There are no token ids here: the server renders the chat template and keeps its own prefix cache (the
  radix tree lives on the server). Conversations use ``RemoteFormat``, which renders nothing, so every
  message's ``token_ids`` stay empty; messages go out as ``Message.template_dict(native_tools=True)``.
- Constraints are request fields: ``constraint()`` returns ``response_format`` (JSON mode) or
  ``tools``/``tool_choice`` (tool mode) instead of a grammar matcher.
- Usage is what the server reports. ``prompt_tokens``/``cached_tokens`` are None where it reports
  nothing (llama.cpp sends no usage when streaming; SGLang reports cached tokens only with
  ``--enable-cache-report``). TTFT and tokens/s are measured here, client-side.
- Failures become a ``finish_reason == "error"`` reply with a one-line ``error``, never an exception:
  connection errors, 408/409/429 and 5xx before the first token are retried with backoff
  (``remote_retries``); a stream that ends before its first token without finishing (llama-cpp-python's
  server cuts a running request short when another one arrives) is sent again once, as a new request; a
  stream that breaks after the first token keeps the partial reply, marked ``meta["partial"]``. A server
  that stays silent longer than ``remote_timeout`` is not retried (it has the request; asking again only
  adds load).

Streaming (SSE), typed errors and the HTTP client come from the ``openai`` package; its own retries are
off because they end when the response headers arrive, and ours must cover the wait for the first token.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import TYPE_CHECKING, Any

from radixchat.chat.backend import ChatBackend, RequestFields
from radixchat.chat.conversation import Conversation, Message
from radixchat.chat.modes import ConstraintSpec, ModeError
from radixchat.chat.remote_link import ServerLink
from radixchat.chat.remote_reply import RemoteReply
from radixchat.chat.usage import UsageTotals
from radixchat.config import normalize_base_url
from radixchat.errors import BackendUnavailableError, ConfigError, RemoteError

if TYPE_CHECKING:
    from radixchat.sampling import SamplingParams

CACHE_TREE_NOTE = "The KV cache tree lives on the server ({url}); this client cannot show it."


class RemoteFormat:
    """The ``ChatFormat`` stand-in for a remote backend: the server renders and tokenizes, so nothing here
    does. Every message's ``token_ids`` stay empty and the delta path never re-renders anything."""

    tokenizer = None  # read by session loading: no vocabulary to check ids against
    delta_ok = True  # read by Conversation

    def render(
        self, messages: list[Message], add_generation_prompt: bool, tools: list[dict] | None = None
    ) -> str:
        return ""

    def encode(self, text: str) -> list[int]:
        return []

    def decode(self, ids: list[int]) -> str:
        return ""


class RemoteBackend(ChatBackend):
    """Chat over an OpenAI-compatible server. Build with ``load_remote_backend(settings)`` (checks the
    model) or ``from_settings`` (no network). The HTTP client is created in the first event loop that
    uses it; call ``aclose()`` when done."""

    fmt: RemoteFormat  # type: ignore[assignment]  # the stand-in: the server renders

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        retries: int = 2,
        max_concurrent: int = 32,
        backoff_s: float = 0.5,
    ) -> None:
        self.link = ServerLink(
            normalize_base_url(base_url),
            api_key=api_key,
            api_key_env=api_key_env,
            timeout_s=timeout_s,
            retries=retries,
            backoff_s=backoff_s,
            max_concurrent=max_concurrent,
        )
        self.base_url = self.link.base_url
        self.model_name = model
        self.fmt = RemoteFormat()
        self.cache_tree_note = CACHE_TREE_NOTE.format(url=self.base_url)

    @classmethod
    def from_settings(cls, settings: Any, model: str | None = None) -> RemoteBackend:
        """Without network access: ``model`` (default: the ``model`` setting) is taken as served."""
        return cls(
            settings.backend,
            model or settings.model,
            api_key=api_key_from_env(settings.api_key_env),
            api_key_env=settings.api_key_env,
            timeout_s=settings.remote_timeout,
            retries=settings.remote_retries,
            max_concurrent=settings.max_running_requests,
        )

    async def aclose(self) -> None:
        await self.link.aclose()

    # -- models ------------------------------------------------------------------------------------------

    async def list_models(self) -> list[str]:
        """Ids the server serves (``GET /models``). Raises BackendUnavailableError."""
        import openai

        # A short-lived client: this may run in a throwaway event loop (a TUI loader thread).
        client = self.link.new_client()
        try:
            page = await client.models.list()
            return [m.id for m in page.data]
        except openai.APIError as exc:
            raise BackendUnavailableError(
                self.link.describe(exc, model=self.model_name, during="listing models")
            ) from None
        finally:
            await client.close()

    async def resolve_model(self, explicit: bool) -> str:
        """Check the ``model`` against what the server serves. Unless ``explicit``, a server with exactly
        one model uses that one (the usual deployment). Raises BackendUnavailableError."""
        served = await self.list_models()
        if self.model_name in served:
            return self.model_name
        hint = f"radixchat --backend {self.base_url} --list-models"
        if not explicit and len(served) == 1:
            self.model_name = served[0]
            return self.model_name
        if not explicit:
            raise BackendUnavailableError(
                f"{self.base_url} serves {len(served)} models; choose one with --model (see {hint})"
            )
        names = ", ".join(served[:8]) + (", ..." if len(served) > 8 else "")
        raise BackendUnavailableError(
            f"model '{self.model_name}' is not served by {self.base_url} (it serves: {names or 'nothing'})"
        )

    # -- the chat protocol -------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int | None:
        return None  # the server tokenizes, and says how many only once the prompt is sent

    def new_conversation(self, system: str | None = None, tools: list[dict] | None = None) -> Conversation:
        return Conversation(self.fmt, system=system, tools=tools)  # type: ignore[arg-type]

    def constraint(self, spec: ConstraintSpec) -> RequestFields:
        """Request fields for one reply as ``spec`` says (see ``backend.grammar_for``). Raises ModeError.
        ``spec.lenient`` changes nothing here: the server enforces what it can, the reply is checked
        after, so no schema is refused as unenforceable (``UnenforceableSchemaError``)."""
        mode, schema, tools = spec.mode, spec.schema, spec.tools
        if mode == "json":
            if schema is None or schema is True or schema == {}:
                return {"response_format": {"type": "json_object"}}
            if not isinstance(schema, dict):
                raise ModeError("json mode: the schema must be a JSON object (or true)")
            return {"response_format": self.link.json_schema_format(schema)}
        if mode == "tool":
            if not tools:
                raise ModeError("tool mode needs at least one declared tool")
            choice: str | dict = spec.tool_choice
            if isinstance(choice, dict):
                choice = {"type": "function", "function": {"name": choice["name"]}}
            return {
                "tools": [{"type": "function", "function": t} for t in tools],
                "tool_choice": choice,
                "parallel_tool_calls": spec.max_calls > 1,
            }
        raise ModeError(f"unknown mode '{mode}'")

    def reply(
        self, conv: Conversation, params: SamplingParams, constraint: RequestFields | None = None
    ) -> RemoteReply:
        """Start streaming the reply to the conversation's last message (needs a running event loop)."""
        if not conv.messages or conv.messages[-1].role not in ("user", "tool"):
            raise RemoteError("nothing to reply to: the conversation does not end with a user message")
        request = self.request(conv, params, constraint)
        return RemoteReply(self.link, conv, request)

    def request(
        self, conv: Conversation, params: SamplingParams, grammar: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The ``chat.completions.create`` arguments for one reply."""
        extra: dict[str, Any] = {}
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        if params.repetition_penalty != 1.0:
            extra["repetition_penalty"] = params.repetition_penalty
        req: dict[str, Any] = {
            "model": self.model_name,
            "messages": request_messages(conv.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            req["seed"] = params.seed
        if params.stop:
            req["stop"] = list(params.stop)
        if extra:
            req["extra_body"] = extra
        req.update(grammar or {})
        return req

    def totals(self) -> UsageTotals:
        """As the server reported usage (no engine here: ``stats()`` is None, the tree cannot be shown)."""
        return self.link.totals.snapshot()


def api_key_from_env(name: str) -> str | None:
    """The API key in ``$name`` (None if unset or empty). A key that cannot go into an HTTP header is a
    configuration error that names the variable, never the key."""
    key = os.environ.get(name) or None
    if key is not None and not (key.isascii() and key.isprintable()):
        what = "a non-ASCII character" if not key.isascii() else "a control character (a stray newline?)"
        raise ConfigError(f"${name} holds {what}; an API key is printable ASCII")
    return key


def request_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as the OpenAI API takes them: tool calls with ids and JSON-string arguments, and each tool
    result tied to its call by ``tool_call_id`` (in order, as the tool turn appends them)."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for i, m in enumerate(messages):
        d = m.template_dict(native_tools=True)
        d.pop("reasoning_content", None)  # servers take back the answer only (DeepSeek's refuses it)
        if m.role == "assistant" and m.tool_calls:
            ids = list(m.meta.get("tool_call_ids") or [])
            ids += [f"call_{i}_{k}" for k in range(len(ids), len(m.tool_calls))]
            d["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": c["name"], "arguments": _json_text(c["arguments"])},
                }
                for cid, c in zip(ids, m.tool_calls)
            ]
            pending = ids[: len(m.tool_calls)]
        elif m.role == "tool":
            d["tool_call_id"] = pending.pop(0) if pending else f"call_{i}"
        out.append(d)
    return out


def load_remote_backend(settings: Any, progress: Any = None) -> RemoteBackend:
    """A backend for ``settings.backend`` with its model checked against the server (blocking: for a
    loader thread)."""
    if progress is not None:
        progress(f"connecting to {settings.backend}")
    backend = RemoteBackend.from_settings(settings)
    asyncio.run(backend.resolve_model(explicit="model" in settings.model_fields_set))
    return backend


def _json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
