"""What a conversation's session records besides its messages, shared by both front ends.

``SessionState`` is one model for the fields a session file carries with a conversation: the model, the
mode and its inputs (JSON Schema, offered tools, tool_choice), the session-notes tools' notes, the
per-session sampling settings, and the file it was loaded from. The app's ``ChatState`` extends it with
branches and what the window shows; batch mode's plan for a line extends it with what one run needs.
Both save through ``write`` (atomic; in a thread in the app), so a session is written one way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

    def write(self, session: SessionFile, folder: Path) -> Path:
        """Write ``session`` into ``folder`` under its name (atomically) and make it the base of later
        saves. Blocking: the app runs it in a thread. Raises OSError."""
        path = save_session(session, session_path(folder, session.name))
        self.base = session
        return path

    def adopt_settings(self, session: SessionFile) -> None:
        """Take a loaded session's settings (not its conversation: that needs the backend's format)."""
        self.base = session
        self.mode = session.mode
        self.schema = session.json_schema
        self.sampling = session.sampling.model_copy()
        self.tool_names = list(session.tools) or None
        self.tool_choice = session.tool_choice
        self.tool_ctx = ToolContext(notes=session.notes)
