"""One tool turn shown in the transcript.

``radixchat.chat.tool_turn.run_tool_turn`` runs the turn (rounds of replies and tool calls); this module
shows it: each round's reply streams into its own assistant message (its ``<tool_call>`` text held out),
each call it makes gets a pending ``ToolCallBlock`` that its result fills in, and user tools ask first
(``ConsentScreen``). Esc (``ReplyInFlight.cancel``) stops the reply being written and any further rounds;
a tool already running finishes (its result is kept), and a pending question is answered *deny*.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixchat.chat.conversation import Conversation, Message
from radixchat.chat.tool_turn import ToolTurn, run_tool_turn
from radixchat.tui.screens.consent import ConsentScreen
from radixchat.tui.widgets.assistant_message import AssistantMessage

if TYPE_CHECKING:
    from textual.app import App

    from radixchat.chat.backend import ChatBackend, Reply, TurnResult
    from radixchat.chat.tools import Tool, ToolCallRecord, ToolRegistry
    from radixchat.sampling import SamplingParams
    from radixchat.tui.in_flight import ReplyInFlight
    from radixchat.tui.state import ChatState
    from radixchat.tui.widgets.tool_call import ToolCallBlock
    from radixchat.tui.widgets.transcript import Transcript


def declare_tools(conv: Conversation, decls: list[dict[str, Any]]) -> None:
    """Make ``conv`` declare ``decls`` (the declarations are part of its rendering); a trailing user
    message is rendered again after them, as ``run_tool_turn`` would do."""
    if conv.tools == decls:
        return
    last = conv.messages.pop() if conv.messages and conv.messages[-1].role == "user" else None
    conv.tools = decls
    if last is not None:
        conv.add_user(last.content)


def annotate_results(conv: Conversation, start: int, records: list[ToolCallRecord]) -> None:
    """Keep each call's duration and failure on its tool message (the transcript rebuilds blocks from
    them, and they are saved with the session)."""
    tool_messages = [m for m in conv.messages[start:] if m.role == "tool"]
    for message, record in zip(tool_messages, records):
        message.meta.update(duration_ms=round(record.duration_ms, 1), error=record.error is not None)


@dataclass
class ToolTurnView:
    """Runs the tool turn of ``conv`` (which ends with the user's message) through ``transcript``."""

    app: App
    backend: ChatBackend
    conv: Conversation
    params: SamplingParams
    tools: list[Tool]  # the offered tools
    registry: ToolRegistry
    state: ChatState  # tool_choice, "always allow" answers, notes; each reply's numbers are recorded
    transcript: Transcript
    in_flight: ReplyInFlight
    status: Callable[[str | None], None]  # the status line's activity (None: the usual one)
    command_of: Callable[[str], list[str] | None]  # the command a user tool runs (shown when asking)
    max_rounds: int = 4
    max_calls: int = 1
    records: list[ToolCallRecord] = field(default_factory=list)
    _pending: list[ToolCallBlock] = field(default_factory=list)  # this round's blocks without a result

    async def run(self) -> ToolTurn:
        """The turn; each call's duration and failure are kept on its tool message, even when it fails."""
        start = len(self.conv.messages)
        try:
            return await run_tool_turn(
                self.backend,
                self.conv,
                None,
                self.params,
                self.tools,
                self.registry,
                self.state.tool_ctx,
                self._consent,
                tool_choice=self.state.tool_choice,
                max_rounds=self.max_rounds,
                max_calls=self.max_calls,
                on_reply=self._show_reply,
                on_call=self._on_call,
                should_continue=lambda: not self.in_flight.stopped,
            )
        finally:
            annotate_results(self.conv, start, self.records)

    async def _show_reply(self, reply: Reply) -> TurnResult:
        view = AssistantMessage(Message("assistant", ""), len(self.conv.messages), "tool", streaming=True)
        await self.transcript.add(view)
        result, self._pending[:] = await self.in_flight.stream(reply, view, "tool", tool_mode=True)
        self.state.record(result)
        if self._pending:
            n = len(self._pending)
            self.status(f"running {n} tool call{'s' if n > 1 else ''}… (Esc stops)")
        return result

    def _on_call(self, record: ToolCallRecord) -> None:
        self.records.append(record)
        if self._pending:
            self._pending.pop(0).set_outcome(record.result, record.error, round(record.duration_ms, 1))
        if not self._pending:
            self.status(None)

    async def _consent(self, tool: Tool, arguments: dict[str, Any]) -> bool:
        allowed = self.state.allowed_tools
        if tool.name in allowed:
            return True
        if self.in_flight.stopped:
            return False
        if self._pending:
            self._pending[0].set_asking()
        answer = await self.in_flight.ask(
            self.app, ConsentScreen(tool, arguments, self.command_of(tool.name))
        )
        if answer == "always":
            allowed.add(tool.name)
        return answer in ("once", "always")
