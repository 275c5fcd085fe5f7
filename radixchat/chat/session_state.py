"""What a conversation's session records besides its messages, shared by both front ends.

``SessionState`` is one model for the fields a session file carries with a conversation: the model, the
mode and its inputs (JSON Schema, offered tools, tool_choice), the session-notes tools' notes, the
per-session sampling settings, and the file it was loaded from. The app's ``ChatState`` extends it with
branches and what the window shows; batch mode's plan for a line extends it with what one run needs.
Both save through ``write`` (atomic; in a thread in the app), so a session is written one way: the file
first, then, best effort, the KV of its token path in the backend's KV store (so it reopens warm).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixchat.chat.backend import ChatBackend, StoredKV, kv_owner
from radixchat.chat.conversation import Conversation
from radixchat.chat.modes import Mode
from radixchat.chat.session import (
    SamplingSettings,
    SessionFile,
    save_session,
    session_from_conversation,
    session_path,
)
from radixchat.chat.tools import ToolContext

ToolChoice = str | dict[str, Any]  # "auto" | "required" | "none" | {"name": TOOL}

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Saved:
    """A written session: its file, and what the backend's KV store kept of its token path."""

    path: Path
    kv: StoredKV | None = None  # None: no KV store (a remote server, the store off) or no ids

    @property
    def kv_notice(self) -> str | None:
        """One line on KV that could not be stored (the session itself is saved)."""
        return self.kv.notice if self.kv is not None else None


def save_kv(backend: ChatBackend, path: Path, ids: Sequence[int]) -> StoredKV | None:
    """Store the KV of ``ids`` for the session file ``path``. Best effort: a failure is a notice, never
    an exception (the session file is what matters; its KV is a cache of it)."""
    try:
        return backend.save_kv(ids, kv_owner(path))
    except Exception as exc:  # noqa: BLE001 - a cache must never cost the session its save
        log.warning("KV of %s not saved: %s", path, exc, exc_info=True)
        return StoredKV(0, 0, f"KV not saved: {exc}")


@dataclass
class SessionState:
    model: str = ""
    mode: Mode = "chat"
    schema: dict[str, Any] | bool | None = None
    # Tool mode: the offered tools (None: the built-ins) and tool_choice.
    tool_names: list[str] | None = None
    tool_choice: ToolChoice = "auto"
    tool_ctx: ToolContext = field(default_factory=ToolContext)  # the session-notes tools' notes
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # overrides of the settings
    base: SessionFile | None = None  # the session as loaded (keeps created_at and what else it had)

    def session_file(self, conv: Conversation, name: str, **fields: Any) -> SessionFile:
        """``conv`` and this state as the session ``name`` (``fields``: more ``SessionFile`` fields, such
        as the inactive branches). Call it where ``conv`` is changed (the event loop), then ``write``."""
        return session_from_conversation(
            conv,
            name=name,
            model=self.model,
            mode=self.mode,
            base=self.base,
            json_schema=self.schema,
            tools=list(self.tool_names) if self.tool_names is not None else [],
            sampling=self.sampling.model_copy(),
            notes=self.tool_ctx.notes,
            tool_choice=self.tool_choice,
            **fields,
        )

    def write(
        self,
        session: SessionFile,
        folder: Path,
        backend: ChatBackend | None = None,
        ids: Sequence[int] = (),
    ) -> Saved:
        """Write ``session`` into ``folder`` under its name (atomically) and make it the base of later
        saves; then, with a ``backend``, store the KV of ``ids`` (the active branch's tokens) for it, best
        effort. Blocking: the app runs it in a thread. Raises OSError for the session file only."""
        path = save_session(session, session_path(folder, session.name))
        self.base = session
        kv = save_kv(backend, path, ids) if backend is not None and ids else None
        return Saved(path, kv)

    def adopt_settings(self, session: SessionFile) -> None:
        """Take a loaded session's settings (not its conversation: that needs the backend's format)."""
        self.base = session
        self.mode = session.mode
        self.schema = session.json_schema
        self.sampling = session.sampling.model_copy()
        self.tool_names = list(session.tools) or None
        self.tool_choice = session.tool_choice
        self.tool_ctx = ToolContext(notes=session.notes)
