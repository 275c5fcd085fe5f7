"""The app's tool mode: the tools screen, the consent dialog, and one tool turn through the transcript.

A mixin of ``RadixChatApp`` (as ``ChatActions`` is). A turn runs ``radixchat.chat.tool_turn.run_tool_turn``
in a worker: each round's reply streams into its own assistant message (its ``<tool_call>`` text held
out), each call it makes gets a pending ``ToolCallBlock`` that its result fills in, and user tools ask
first (``ConsentScreen``). Esc stops the reply being written and any further rounds; a tool already
running finishes (its result is kept), and a pending question is answered *deny*.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from textual import work
from textual.css.query import NoMatches

from radixchat.chat.conversation import Conversation, Message
from radixchat.chat.usage import decorate_footer
from radixchat.errors import RadixchatError
from radixchat.tool_format import tool_call_dicts
from radixchat.tui.backend import make_params
from radixchat.tui.messages import TurnFinished
from radixchat.tui.screens.consent import ConsentScreen
from radixchat.tui.screens.tools import ToolSetup, ToolsScreen
from radixchat.tui.tools import choice_label, command_of, offered
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.note import Note
from radixchat.tui.widgets.user_message import UserMessage

if TYPE_CHECKING:
    from radixchat.chat.tools import Tool, ToolCallRecord
    from radixchat.tui.app import RadixChatApp
    from radixchat.tui.widgets.tool_call import ToolCallBlock

    _Base = RadixChatApp
else:
    _Base = object


class ToolTurnControl:
    """A running tool turn, held as the app's current reply (``cancel`` is what Esc calls)."""

    def __init__(self) -> None:
        self.reply: Any = None  # the round being generated, if any
        self.stopped = False
        self._question: asyncio.Future[str] | None = None
        self._screen: ConsentScreen | None = None

    def cancel(self) -> None:
        self.stopped = True
        if self.reply is not None:
            self.reply.cancel()
        if self._question is not None and not self._question.done():
            self._question.set_result("deny")
            if self._screen is not None and self._screen.is_current:
                self._screen.dismiss("deny")

    async def ask(self, app: Any, screen: ConsentScreen) -> str:
        """Show ``screen`` and wait for its answer (or ``deny`` when the turn is stopped meanwhile)."""
        question: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._question, self._screen = question, screen

        def answered(answer: str | None) -> None:
            if not question.done():
                question.set_result(answer or "deny")

        app.push_screen(screen, answered)
        try:
            return await question
        finally:
            self._question = self._screen = None


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


class ToolActions(_Base):
    # -- the tools screen ---------------------------------------------------------------------------------

    def offered_tools(self) -> list[Tool]:
        return offered(self.registry, self.state.tool_names)

    def tool_declarations(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.offered_tools()]

    def tool_activity(self) -> str:
        n = len(self.offered_tools())
        return f"{n} tool{'' if n == 1 else 's'} · tool_choice {choice_label(self.state.tool_choice)} · F4 chooses"

    def action_show_tools(self) -> None:
        s = self.state

        async def done(setup: ToolSetup | None) -> None:
            if setup is None:
                return
            s.tool_names, s.tool_choice = setup.names, setup.choice
            self.notify(
                f"{len(setup.names)} tools offered · tool_choice {choice_label(setup.choice)}",
                title="Tool mode",
            )
            await self.action_set_mode("tool")
            if s.session_name and self._has_turns():
                await self.write_session(s.session_name)

        tools = list(self.registry.tools.values())
        commands = {t.name: command_of(self.settings, t.name) or [] for t in tools if not t.builtin}
        problem = self.mode_problem if s.mode == "tool" else None
        screen = ToolsScreen(tools, [t.name for t in self.offered_tools()], s.tool_choice, problem, commands)
        self.push_screen(screen, done)

    def check_session_tools(self) -> None:
        """After opening a session: drop the tools it names that the config file no longer declares."""
        names = self.state.tool_names
        if names is None:
            return
        missing = [n for n in names if n not in self.registry.tools]
        if missing:
            self.state.tool_names = [n for n in names if n in self.registry.tools] or None
            self.notify(
                f"This session offered {', '.join(missing)}, which the config file does not declare now.",
                title="Tools",
                severity="warning",
            )

    # -- a tool turn --------------------------------------------------------------------------------------

    async def start_tool_turn(self, *new: UserMessage, rebuild: bool = False) -> None:
        """Run the tool turn for the active conversation, which ends with the user's message."""
        conv = self.state.conv
        if rebuild:
            await self.transcript.show(conv.messages)
        await self.transcript.add(*new)
        control = ToolTurnControl()
        self._reply, self._reply_view = control, None
        self.state.editing = None
        self.update_status()
        self.run_tool_turn(conv, control)

    @work(group="reply", exit_on_error=False)
    async def run_tool_turn(self, conv: Conversation, control: ToolTurnControl) -> None:
        from radixchat.chat.tool_turn import run_tool_turn  # imports the engine: after it has loaded

        s = self.state
        start = len(conv.messages)
        records: list[ToolCallRecord] = []
        pending: list[ToolCallBlock] = []  # the current round's blocks still without a result

        async def on_reply(reply: Any) -> Any:
            control.reply = reply
            if control.stopped:
                reply.cancel()
            view = AssistantMessage(Message("assistant", ""), len(conv.messages), "tool", streaming=True)
            await self.transcript.add(view)
            self._reply_view = view
            try:
                await view.stream_from(reply, hide_calls=True)
                result = await reply.result()
            except Exception as exc:  # the backend broke mid-stream: keep what came, say why
                text = "".join(view.streamed)
                await view.finish(Message("assistant", text, finish_reason="error"), f"error: {exc}", "tool")
                raise
            finally:
                control.reply, self._reply_view = None, None
            msg = result.message
            msg.meta["mode"] = "tool"
            calls = msg.tool_calls
            if calls is None and result.finish_reason == "stop":
                calls = tool_call_dicts(msg.content)  # what run_tool_turn will find and run
            footer = decorate_footer(
                result.footer(), result.finish_reason, result.error, bool(msg.meta.get("partial"))
            )
            pending[:] = await view.finish(msg, footer, "tool", calls or [])
            s.record_turn(
                result.prompt_tokens, result.cached_tokens, result.ttft_ms, result.decode_tokens_per_s
            )
            if pending:
                self.update_status(
                    f"running {len(pending)} tool call{'s' if len(pending) > 1 else ''}… (Esc stops)"
                )
            return result

        def on_call(record: ToolCallRecord) -> None:
            records.append(record)
            if pending:
                pending.pop(0).set_outcome(record.result, record.error, round(record.duration_ms, 1))
            if not pending:
                self.update_status()

        async def consent(tool: Tool, arguments: dict[str, Any]) -> bool:
            if tool.name in s.allowed_tools:
                return True
            if control.stopped:
                return False
            if pending:
                pending[0].set_asking()
            screen = ConsentScreen(tool, arguments, command_of(self.settings, tool.name))
            answer = await control.ask(self, screen)
            if answer == "always":
                s.allowed_tools.add(tool.name)
            return answer in ("once", "always")

        result = None
        try:
            turn = await run_tool_turn(
                self.backend,
                conv,
                None,
                make_params(self.settings, s.sampling),
                self.offered_tools(),
                self.registry,
                s.tool_ctx,
                consent,
                tool_choice=s.tool_choice,
                max_rounds=self.settings.max_tool_rounds,
                on_reply=on_reply,
                on_call=on_call,
                should_continue=lambda: not control.stopped,
            )
            result = turn.final
        except Exception as exc:  # a request refused, a backend failure: the turn ends here
            error = str(exc) if isinstance(exc, RadixchatError) else f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(NoMatches):  # the app may be closing
                await self.transcript.add(Note(f"the tool turn stopped: {error}", "error"))
            self.notify(error, title="Tool turn failed", severity="error")
        finally:
            self._reply = self._reply_view = None
            annotate_results(conv, start, records)
        self.post_message(TurnFinished(result))
