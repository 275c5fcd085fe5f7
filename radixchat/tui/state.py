"""What the chat app knows about the current session, with no Textual in it.

``ChatState`` is the chat layer's ``SessionState`` (the mode and its inputs, the offered tools and
tool_choice, the notes, the per-session sampling settings: what a session file records with a
conversation) plus what the app adds: the branches of the conversation (each a ``Conversation`` sharing
a cached prefix with the others), the per-session system prompt, the session's name, the "always allow"
answers, and the recent turns' numbers. It converts to and from ``SessionFile``: the active branch is the
file's ``messages``, the others its ``branches``.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from radixchat.chat.conversation import Conversation, Message
from radixchat.chat.modes import MODES, Mode
from radixchat.chat.session import SessionBranch, SessionFile, conversation_from_session, session_messages
from radixchat.chat.session_state import SessionState
from radixchat.chat.tools import ToolContext

if TYPE_CHECKING:
    from radixchat.chat.backend import TurnResult
    from radixchat.chat.conversation import ChatFormat

HIT_HISTORY = 30  # turns kept for the hit-rate sparkline


@dataclass(slots=True)
class Branch:
    conv: Conversation
    label: str  # how it came to be: "main", "edit of message 3", "regenerated reply 2"


def auto_session_name(when: datetime | None = None) -> str:
    return (when or datetime.now()).strftime("chat-%Y%m%d-%H%M%S")


def display_messages(session: SessionFile) -> list[Message]:
    """The session's messages as chat ``Message`` objects (content only: no ids), for showing early."""
    msgs = [
        Message(m.role, m.content, [], "", m.finish_reason, m.tool_calls, m.name, dict(m.meta), m.dropped)
        for m in session.messages
    ]
    if session.system_prompt is not None and not (msgs and msgs[0].role == "system"):
        msgs.insert(0, Message("system", session.system_prompt))
    return msgs


def rerendered(conv: Conversation, fmt: ChatFormat, system: str | None) -> Conversation:
    """A copy of ``conv`` under another system prompt; ids are dropped, the next turn renders it whole."""
    rest = [m for m in conv.messages if m.role != "system"]
    msgs = [Message("system", system)] if system else []
    for m in rest:
        msgs.append(
            Message(
                m.role,
                m.content,
                [],
                "",
                m.finish_reason,
                copy.deepcopy(m.tool_calls),
                m.name,
                dict(m.meta),
                m.dropped,
            )
        )
    new = Conversation(fmt, tools=conv.tools, messages=msgs)
    new.context_overflow = conv.context_overflow
    return new


def ensure_prompt(conv: Conversation) -> None:
    """Give a conversation that ends with a user message but lacks its ids (a session from another model,
    a changed system prompt) a full rendering, so ``prompt_ids()`` is the whole conversation."""
    last = conv.messages[-1] if conv.messages else None
    if (
        last is not None
        and last.role == "user"
        and (not last.token_ids or any(not m.token_ids for m in conv.active if m.role != "system"))
    ):
        conv.messages.pop()
        conv.add_user(last.content)


@dataclass
class ChatState(SessionState):
    # JSON mode runs the schema leniently (the user agreed): keywords the grammar cannot enforce are
    # checked on each finished reply instead (chat/schema_check.py). Not saved with the session.
    lenient: bool = False
    allowed_tools: set[str] = field(default_factory=set)  # "always allow" answers, this session only
    system_prompt: str | None = None
    session_name: str | None = None
    auto_named: bool = False  # the name was made up by autosave, not chosen
    branches: list[Branch] = field(default_factory=list)
    active: int = 0
    hit_history: deque[float] = field(default_factory=lambda: deque(maxlen=HIT_HISTORY))
    last_hit: float | None = None  # cached / prompt tokens of the last reply (None: not reported)
    last_speed: tuple[float | None, float | None] = (None, None)  # TTFT ms, decode tok/s of the last reply
    editing: int | None = None  # index of the user message being edited (a new branch on send)

    # -- conversation and branches --------------------------------------------------------------------

    @property
    def conv(self) -> Conversation | None:
        return self.branches[self.active].conv if self.branches else None

    def reset(self, conv: Conversation | None) -> None:
        self.branches = [Branch(conv, "main")] if conv is not None else []
        self.active = 0
        self.editing = None

    def fork(self, conv: Conversation, label: str) -> None:
        """Add ``conv`` as a new branch and make it active; the old branch is kept."""
        self.branches.append(Branch(conv, label))
        self.active = len(self.branches) - 1

    def switch(self, index: int) -> None:
        if not 0 <= index < len(self.branches):
            raise IndexError(index)
        self.active = index
        self.editing = None
        conv = self.conv
        if conv is not None:  # a branch may have been made with another system prompt (F2)
            self.system_prompt = conv.system

    # -- modes ------------------------------------------------------------------------------------------

    def next_mode(self) -> Mode:
        return MODES[(MODES.index(self.mode) + 1) % len(MODES)]

    # -- turns ------------------------------------------------------------------------------------------

    def record_turn(
        self,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        ttft_ms: float | None = None,
        decode_tokens_per_s: float | None = None,
    ) -> None:
        """One reply's numbers; a remote server may report no prompt or cached tokens (None)."""
        self.last_hit = cached_tokens / prompt_tokens if prompt_tokens and cached_tokens is not None else None
        if self.last_hit is not None:
            self.hit_history.append(self.last_hit)
        self.last_speed = (ttft_ms, decode_tokens_per_s)

    def record(self, result: TurnResult) -> None:
        """A finished reply's numbers (see ``record_turn``)."""
        self.record_turn(
            result.prompt_tokens, result.cached_tokens, result.ttft_ms, result.decode_tokens_per_s
        )

    def new_session(self) -> None:
        """Forget what belongs to the saved session (a new chat): its notes and "always allow" answers."""
        self.session_name, self.auto_named, self.base = None, False, None
        self.hit_history.clear()
        self.last_hit = None
        self.allowed_tools.clear()
        self.tool_ctx = ToolContext()

    # -- sessions ---------------------------------------------------------------------------------------

    def to_session(self, name: str) -> SessionFile:
        """The session ``name``: the active branch as its messages, the others as its branches."""
        conv = self.conv
        if conv is None:
            raise ValueError("no conversation to save")
        return self.session_file(
            conv,
            name,
            branches=[
                SessionBranch(label=b.label, messages=session_messages(b.conv))
                for i, b in enumerate(self.branches)
                if i != self.active
            ],
            active_branch_label=self.branches[self.active].label,
            active_branch_index=self.active,
        )

    def adopt(self, session: SessionFile) -> None:
        """Take the session's settings (not its conversation: that needs the backend's format)."""
        self.adopt_settings(session)
        self.session_name = session.name
        self.auto_named = False
        self.system_prompt = session.system_prompt
        self.lenient = False  # agreed for the schema it was asked about: another session's asks again
        self.allowed_tools.clear()
        self.hit_history.clear()
        self.editing = None

    def restore(self, session: SessionFile, fmt: ChatFormat, model: str, tools: list[dict] | None) -> None:
        """The session's conversations for the backend's format: its inactive branches first, in the
        order saved, then the active one (``tools``: the declarations its tool turns were rendered with)."""
        branches = [
            Branch(
                conversation_from_session(
                    session.model_copy(update={"messages": b.messages, "system_prompt": None}),
                    fmt,
                    model,
                    tools,
                ),
                b.label,
            )
            for b in session.branches
        ]
        active = conversation_from_session(session, fmt, model, tools)
        index = min(session.active_branch_index, len(branches))
        branches.insert(index, Branch(active, session.active_branch_label))
        self.branches, self.active, self.editing = branches, index, None
