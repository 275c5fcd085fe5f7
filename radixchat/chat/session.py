"""Session files: one versioned JSON format, validated by pydantic, written atomically.

The TUI and batch mode both read and write sessions through this module only. A file is never modified
on load, whatever is wrong with it. Token ids are stored with each message so a reopened conversation
continues from exactly the sequence the engine cached; they are dropped when the model differs.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from radixchat.chat.conversation import ChatFormat, Conversation, Message
from radixchat.chat.thinking import split_thinking
from radixchat.errors import SessionError

SESSION_VERSION = 4
Mode = Literal["chat", "json", "tool"]


def _v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 2 added the inactive branches of a conversation."""
    return {**raw, "version": 2, "branches": []}


def _v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 3 marks messages that left the model's context ("dropped", false when absent)."""
    return {**raw, "version": 3}


def _v3_to_v4(raw: dict[str, Any]) -> dict[str, Any]:
    """Version 4 keeps an assistant's thinking apart ("reasoning", null when absent). Before it, a thinking
    model's reply kept its ``<think>…</think>`` in the content: that moves into "reasoning" now."""

    def upgrade(messages: Any) -> Any:
        if not isinstance(messages, list):
            return messages  # validation reports it
        out = []
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), str):
                reasoning, answer = split_thinking(m["content"])
                if reasoning is not None:
                    m = {**m, "content": answer, "reasoning": reasoning}
            out.append(m)
        return out

    branches = raw.get("branches")
    if isinstance(branches, list):
        branches = [
            {**b, "messages": upgrade(b.get("messages"))} if isinstance(b, dict) else b for b in branches
        ]
    return {**raw, "version": 4, "messages": upgrade(raw.get("messages", [])), "branches": branches or []}


# version -> function upgrading a raw dict of that version to the next one
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _v1_to_v2,
    2: _v2_to_v3,
    3: _v3_to_v4,
}


def now() -> datetime:
    return datetime.now(timezone.utc)


class SessionMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    token_ids: list[NonNegativeInt] | None = None
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    name: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    dropped: bool = False  # left the model's context: shown and kept, no longer sent to the model
    reasoning: str | None = None  # an assistant's thinking (``content`` is its answer)


class SamplingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] | None = None  # stop sequences

    @model_serializer(mode="wrap")
    def _without_unset_stop(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Added after version 3 without a new version: left out while unset, a file stays readable by a
        # radixchat from before it.
        data = handler(self)
        if data.get("stop") is None:
            data.pop("stop", None)
        return data


class SessionBranch(BaseModel):
    """An inactive branch: the whole message list it had (branches share their common prefix)."""

    model_config = ConfigDict(extra="forbid")

    label: str
    messages: list[SessionMessage] = Field(default_factory=list)


class SessionFile(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    version: Literal[4] = SESSION_VERSION
    name: str
    model: str
    mode: Mode = "chat"
    system_prompt: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    tools: list[str] = Field(default_factory=list)
    sampling: SamplingSettings = Field(default_factory=SamplingSettings)
    messages: list[SessionMessage] = Field(default_factory=list)  # the active branch
    branches: list[SessionBranch] = Field(default_factory=list)  # the others (edit / regenerate)
    active_branch_label: str = "main"
    active_branch_index: int = Field(0, ge=0)  # where the active branch sits among all of them
    tool_choice: str | dict[str, Any] = "auto"  # tool mode: auto | required | none | {"name": TOOL}
    notes: str = ""  # scratch text for the session-notes tools
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m.role == "user")


def safe_name(name: str) -> str:
    """A file-system-safe session name (letters, digits, '-', '_', '.')."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in name.strip()).strip(".-")
    return cleaned[:120] or "session"


def session_path(sessions_dir: Path, name: str) -> Path:
    return Path(sessions_dir) / f"{safe_name(name)}.json"


def latest_session(sessions_dir: Path) -> Path | None:
    """The most recently written session file in ``sessions_dir`` (``radixchat --continue``), or None.

    By modification time, so it is the session last saved, whichever program saved it; the files are not
    read here (a damaged one is reported when it is opened)."""
    newest: tuple[float, Path] | None = None
    for path in Path(sessions_dir).glob("*.json"):
        try:
            mtime = path.stat().st_mtime
        except OSError:  # removed since the listing
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, path)
    return newest[1] if newest is not None else None


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory, fsync, rename, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def save_session(session: SessionFile, path: Path) -> Path:
    session.updated_at = now()
    atomic_write_text(path, session.model_dump_json(by_alias=True, indent=2, exclude_none=False) + "\n")
    return Path(path)


def load_session(path: Path, expect_model: str | None = None) -> SessionFile:
    """Read and validate a session file. Raises SessionError (one line) and never touches the file."""
    path = Path(path)
    try:
        raw_text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SessionError(f"session file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SessionError(f"cannot read session {path}: {exc}") from None
    try:
        raw = json.loads(raw_text)
    except json.JSONDecodeError as exc:
        raise SessionError(
            f"session {path} is not valid JSON (truncated?): line {exc.lineno}: {exc.msg}"
        ) from None
    if not isinstance(raw, dict):
        raise SessionError(f"session {path} is not a JSON object")
    version = raw.get("version")
    if not isinstance(version, int):
        raise SessionError(f"session {path} has no version number")
    while version in MIGRATIONS:
        raw = MIGRATIONS[version](raw)
        version = raw["version"]
    if version != SESSION_VERSION:
        raise SessionError(
            f"session {path} has version {version}; this radixchat reads version {SESSION_VERSION}"
        )
    try:
        session = SessionFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise SessionError(f"session {path} is invalid at '{where}': {err['msg']}") from None
    if expect_model is not None and session.model != expect_model:
        raise SessionError(f"session {path} was saved with model '{session.model}', not '{expect_model}'")
    return session


def conversation_from_session(
    session: SessionFile, fmt: ChatFormat, model: str, tools: list[dict] | None = None
) -> Conversation:
    """Rebuild a conversation. Token ids are kept only for the same model (they are its tokenizer's)."""
    same_model = session.model == model
    vocab = len(fmt.tokenizer) if fmt.tokenizer is not None else None  # None: a remote server's format
    if vocab is not None and any(i >= vocab for m in session.messages for i in m.token_ids or ()):
        same_model = False  # ids the tokenizer does not have (a damaged file): re-render from the text
    messages = []
    for m in session.messages:
        ids = list(m.token_ids) if same_model and m.token_ids is not None else []
        messages.append(
            Message(
                m.role,
                m.content,
                ids,
                fmt.decode(ids) if ids else "",
                m.finish_reason,
                m.tool_calls,
                m.name,
                dict(m.meta),
                m.dropped,
                m.reasoning,
            )
        )
    if not same_model or any(m.role != "system" and not m.token_ids for m in messages if not m.dropped):
        for m in messages:  # partial ids are useless: the next turn renders the whole conversation
            m.token_ids, m.rendered = [], ""
    if session.system_prompt is not None and not (messages and messages[0].role == "system"):
        messages.insert(0, Message("system", session.system_prompt))
    return Conversation(fmt, tools=tools, messages=messages)


def session_messages(conv: Conversation) -> list[SessionMessage]:
    return [
        SessionMessage(
            role=m.role,
            content=m.content,
            token_ids=list(m.token_ids) if m.token_ids else None,
            finish_reason=m.finish_reason,
            tool_calls=m.tool_calls,
            name=m.name,
            meta=dict(m.meta),
            dropped=m.dropped,
            reasoning=m.reasoning,
        )
        for m in conv.messages
    ]


def session_from_conversation(
    conv: Conversation,
    *,
    name: str,
    model: str,
    mode: Mode = "chat",
    base: SessionFile | None = None,
    **fields: Any,
) -> SessionFile:
    msgs = session_messages(conv)
    data: dict[str, Any] = base.model_dump(by_alias=False) if base is not None else {}
    data.update(name=name, model=model, mode=mode, system_prompt=conv.system, messages=msgs, **fields)
    return SessionFile.model_validate(data)
