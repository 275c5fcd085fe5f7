"""The chat screen's turns: send, queue while loading, regenerate, edit into a branch, stop.

``TurnControl`` decides on what the screen's ``ChatCore`` holds (the backend, the session state, the
mode's constraint) and shows the turn through a ``TurnHost`` (the chat screen), using only the members the
protocol names (``tui/host.py``), so this module does not import the screen. It holds the reply in flight
(``ReplyInFlight``): a plain turn's reply streams into a new assistant message; a tool turn runs through
``ToolTurnView``. Both run as the host's workers in the group ``reply`` and end by posting
``TurnFinished`` to the host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from radixchat.chat.conversation import Conversation, Message
from radixchat.chat.modes import ModeError
from radixchat.errors import RadixchatError
from radixchat.tui.context import ContextNotices
from radixchat.tui.host import ChatHost
from radixchat.tui.in_flight import ReplyInFlight
from radixchat.tui.messages import TurnFinished
from radixchat.tui.state import ensure_prompt
from radixchat.tui.tool_turn_view import ToolTurnView, declare_tools
from radixchat.tui.tools import command_of
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.note import Note
from radixchat.tui.widgets.user_message import UserMessage

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from textual.message import Message as TextualMessage
    from textual.worker import Worker

    from radixchat.chat.backend import Constraint, Reply, TurnResult
    from radixchat.tui.chat_core import ChatCore


class TurnHost(ChatHost, Protocol):
    """What the turns use of the chat screen."""

    def offer_lenient(self, problem: ModeError) -> bool:
        """Offer to run a schema that strict mode refused leniently (True: the user is asked)."""
        ...

    def run_worker(
        self, work: Coroutine[Any, Any, Any], *, group: str = "default", exit_on_error: bool = True
    ) -> Worker[Any]: ...
    def post_message(self, message: TextualMessage) -> bool: ...


class TurnControl:
    def __init__(self, core: ChatCore, host: TurnHost) -> None:
        self.core = core
        self.host = host
        self.in_flight: ReplyInFlight | None = None  # the turn being generated (Esc stops it)
        self.queued: str | None = None  # sent with Enter before the model was ready
        self._dropped_before = 0  # the turns outside the context when the turn in flight began
        self.context_notices = ContextNotices()

    async def send(self, text: str) -> bool:
        """Send ``text`` as a user message (into a new branch when editing). False: nothing was sent."""
        host, core, s = self.host, self.core, self.core.state
        if (core.backend is None and not core.load_failed) or core.switching is not None:
            return await self._queue(text)
        if not self._can_start():
            return False
        constraint = await core.constraint()
        if isinstance(constraint, ModeError):
            core.mode_error = constraint
            host.update_status()
            if not host.offer_lenient(constraint):
                host.notify(
                    f"{constraint} — switch mode with Ctrl+T. Your message is kept.",
                    title=f"{s.mode} mode",
                    severity="error",
                )
            return False
        editing = s.editing
        conv = s.conv.truncated(editing) if editing is not None else s.conv
        n, tools = len(conv.messages), conv.tools
        self._dropped_before = conv.dropped_turns
        try:
            if s.mode == "tool":
                declare_tools(conv, core.tool_declarations())
            conv.add_user(text)
            reply = None if s.mode == "tool" else self._reply(conv, constraint)
        except RadixchatError as exc:
            del conv.messages[n:]
            conv.tools = tools
            host.notify(str(exc), title="Not sent", severity="error")
            return False
        new = [] if editing is not None else [UserMessage(conv.messages[-1], n)]
        if editing is not None:
            s.fork(conv, f"edit of message {editing}")
        await self._start(reply, *new, rebuild=editing is not None)
        return True

    def _reply(self, conv: Conversation, constraint: Constraint | None) -> Reply:
        core = self.core
        assert core.backend is not None
        return core.backend.reply(conv, core.params(), constraint)

    async def _queue(self, text: str) -> bool:
        """Enter while a model loads (the first, or one switched to): show the message now, send it once
        the model is ready."""
        if self.queued is not None:
            self.host.notify("A message is already waiting for the model.", severity="warning")
            return False
        self.queued = text
        view = UserMessage(Message("user", text), -1, classes="-queued")
        view.border_subtitle = "sends when the model is ready"
        await self.host.transcript.add(view)
        return True

    async def send_queued(self) -> None:
        """The backend is ready: send what was queued (back into the prompt if it cannot go)."""
        text, self.queued = self.queued, None
        if text is None:
            return
        for view in self.host.transcript.query(".-queued"):
            await view.remove()
        if not await self.send(text):
            self.host.prompt.load_text(text)

    def _can_start(self) -> bool:
        host, core = self.host, self.core
        if core.backend is None or core.state.conv is None:
            host.notify(
                f"The model is not ready yet ({core.load_status}). Your message is kept.", severity="warning"
            )
            return False
        if self.in_flight is not None:
            host.notify("A reply is still being generated — Esc stops it.", severity="warning")
            return False
        if core.switching is not None:
            host.notify(f"Wait for {core.switching} to load ({core.switch_status}).", severity="warning")
            return False
        return True

    async def _start(self, reply: Reply | None, *new: UserMessage, rebuild: bool = False) -> None:
        """Show the turn of the active conversation, which ends with the user's message: ``reply``
        streaming into a new message, or (tool mode, ``reply`` None) the tool turn."""
        host, s = self.host, self.core.state
        conv = s.conv
        if rebuild:
            await host.transcript.show(conv.messages)
        await host.transcript.add(*new)
        turn = self.in_flight = ReplyInFlight()
        s.editing = None
        if reply is None:
            host.update_status()
            host.run_worker(self._tool_turn(turn), group="reply", exit_on_error=False)
            return
        view = AssistantMessage(Message("assistant", ""), len(conv.messages), s.mode, streaming=True)
        await host.transcript.add(view)
        turn.view = view  # streaming starts in the worker; Esc may come first
        host.update_status()
        host.run_worker(self._stream(turn, reply, view, s.mode), group="reply", exit_on_error=False)

    async def _stream(self, turn: ReplyInFlight, reply: Reply, view: AssistantMessage, mode: str) -> None:
        result = None
        try:
            result, _ = await turn.stream(reply, view, mode)
        except Exception:  # the backend broke mid-stream: the view keeps what came and says why
            pass
        finally:
            self.in_flight = None
        if not view.is_attached:  # the app closed under the reply
            return
        if result is not None:
            self.core.state.record(result)
        self._finished(result)

    async def _tool_turn(self, turn: ReplyInFlight) -> None:
        host, core, s = self.host, self.core, self.core.state
        assert core.backend is not None and s.conv is not None
        run = ToolTurnView(
            host.app,
            core.backend,
            s.conv,
            core.params(),
            core.offered_tools(),
            core.registry,
            s,
            host.transcript,
            turn,
            host.update_status,
            lambda name: command_of(core.settings, name),
            core.settings.max_tool_rounds,
            core.settings.max_tool_calls,
        )
        result = None
        try:
            result = (await run.run()).final
        except Exception as exc:  # a request refused, a backend failure: the turn ends here
            error = str(exc) if isinstance(exc, RadixchatError) else f"{type(exc).__name__}: {exc}"
            if host.transcript.is_attached:  # the app may be closing
                await host.transcript.add(Note(f"the tool turn stopped: {error}", "error"))
            host.notify(error, title="Tool turn failed", severity="error")
        finally:
            self.in_flight = None
        self._finished(result)

    def _finished(self, result: TurnResult | None) -> None:
        """Say what the turn did to the context (turns that left it, or that it is filling up), then tell
        the screen the turn is over."""
        host, core = self.host, self.core
        conv = core.state.conv
        dropped = max(0, conv.dropped_turns - self._dropped_before) if conv is not None else 0
        notice = self.context_notices.after_turn(core.backend, conv, dropped) if core.backend else None
        if notice and host.transcript.is_attached:  # the app may be closing
            host.transcript.sync_dropped()
            host.notify(notice, title="Context", severity="warning" if dropped else "information")
        host.post_message(TurnFinished(result))

    def stop(self) -> bool:
        """Esc: stop the reply in flight (False: there is none)."""
        if self.in_flight is None:
            return False
        view = self.in_flight.view
        self.in_flight.cancel()
        if view is not None and view.streaming:
            view.set_footer("stopping…")
        return True

    async def regenerate(self) -> None:
        """The last turn again, from the user's last message (with its tool calls, in tool mode)."""
        host, core, s = self.host, self.core, self.core.state
        if not self._can_start():
            return
        conv = s.conv
        users = [i for i, m in enumerate(conv.messages) if m.role == "user"]
        if not users:
            host.notify("Nothing to regenerate yet", severity="warning")
            return
        constraint = await core.constraint()
        if isinstance(constraint, ModeError):
            host.notify(str(constraint), title=f"{s.mode} mode", severity="error")
            return
        forked = users[-1] < len(conv.messages) - 1
        new = conv.truncated(users[-1] + 1) if forked else conv
        tools = new.tools
        self._dropped_before = new.dropped_turns
        try:
            ensure_prompt(new)
            if s.mode == "tool":
                declare_tools(new, core.tool_declarations())
            reply = None if s.mode == "tool" else self._reply(new, constraint)
        except RadixchatError as exc:
            new.tools = tools
            host.notify(str(exc), title="Not regenerated", severity="error")
            return
        if forked:
            s.fork(new, f"regenerated reply {len(users)}")
        await self._start(reply, rebuild=True)

    def edit(self, index: int) -> None:
        """Load user message ``index`` into the prompt; sending it makes a new branch."""
        host = self.host
        if self.in_flight is not None:
            host.notify("Stop the reply first (Esc)", severity="warning")
            return
        self.core.state.editing = index
        host.prompt.load_text(self.core.state.conv.messages[index].content)
        host.prompt.move_cursor(host.prompt.document.end)
        host.prompt.focus()
        host.update_status()
