"""The reply in flight: what Esc stops, and the steps every reply goes through in the transcript.

A plain turn is one reply; a tool turn is several (one per round) with tool calls between them. Both are
held by the chat screen as one ``ReplyInFlight``, and each reply of either goes through ``stream``:
stream the deltas into its view, take the result, render the message once in full with its footer (how it
ended: stopped, cut off, an error), and show the tool calls it made as pending blocks.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from radixchat.chat.conversation import Message
from radixchat.tool_format import tool_call_dicts

if TYPE_CHECKING:
    from textual.app import App
    from textual.screen import Screen

    from radixchat.chat.backend import Reply, TurnResult
    from radixchat.tui.widgets.assistant_message import AssistantMessage
    from radixchat.tui.widgets.tool_call import ToolCallBlock


class ReplyInFlight:
    """The turn being generated: its current reply and view, and (tool mode) a consent question."""

    def __init__(self) -> None:
        self.reply: Reply | None = None  # the reply being generated (a tool turn has none between rounds)
        self.view: AssistantMessage | None = None  # where it streams
        self.stopped = False
        self._question: asyncio.Future[str] | None = None
        self._screen: Screen | None = None

    def cancel(self) -> None:
        """Esc: stop the reply (what came is kept), any further rounds, and answer a question *deny*."""
        self.stopped = True
        if self.reply is not None:
            self.reply.cancel()
        if self._question is not None and not self._question.done():
            self._question.set_result("deny")
            if self._screen is not None and self._screen.is_current:
                self._screen.dismiss("deny")

    async def ask(self, app: App, screen: Screen[str]) -> str:
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

    async def stream(
        self, reply: Reply, view: AssistantMessage, mode: str, *, tool_mode: bool = False
    ) -> tuple[TurnResult, list[ToolCallBlock]]:
        """Stream ``reply`` into ``view`` and render its end. In ``tool_mode`` the ``<tool_call>`` text is
        held out of the stream and every call the reply makes (reported by a remote server, or written in
        its text) gets a pending block, returned in order for the caller to fill in.

        If the backend fails mid-stream (a bug: replies end with ``finish_reason == "error"`` instead),
        the view keeps what came and shows the error, and the exception is raised on."""
        self.reply, self.view = reply, view
        if self.stopped:  # Esc came between two rounds of a tool turn
            reply.cancel()
        try:
            await view.stream_from(reply, hide_calls=tool_mode)
            result = await reply.result()
        except Exception as exc:
            if view.is_attached:
                text = "".join(view.streamed)
                error = f"error: {type(exc).__name__}: {exc}"
                await view.finish(Message("assistant", text, finish_reason="error"), error, mode)
            raise
        finally:
            self.reply = self.view = None
        if not view.is_attached:  # the app closed under the reply
            return result, []
        msg = result.message
        msg.meta["mode"] = mode
        calls = msg.tool_calls
        if tool_mode and calls is None and result.finish_reason == "stop":
            calls = tool_call_dicts(msg.content)  # what the tool turn will find and run
        blocks = await view.finish(msg, result.status_footer(), mode, (calls or []) if tool_mode else None)
        return result, blocks
