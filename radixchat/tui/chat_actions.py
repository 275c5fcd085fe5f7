"""The app's chat actions: modes, sending, streaming, stopping, regenerating, editing, branches.

A mixin of ``RadixChatApp`` (as ``SessionActions`` is). A reply streams in a worker on the event loop (the
model itself runs in the engine's thread); Esc cancels it and the engine keeps what was generated. In tool
mode a turn is several replies and tool calls: ``ToolActions.start_tool_turn`` runs it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from textual import work

from radixchat.chat.conversation import Message
from radixchat.chat.modes import MODES, Mode, ModeError, grammar_for
from radixchat.chat.schema_check import schema_errors, unenforced_keywords
from radixchat.errors import RadixchatError
from radixchat.tui.backend import make_params
from radixchat.tui.messages import EditRequested, PromptSubmitted, RegenerateRequested, TurnFinished
from radixchat.tui.screens.branches import BranchesScreen
from radixchat.tui.screens.dialogs import ConfirmDialog
from radixchat.tui.screens.schema import SchemaScreen
from radixchat.tui.state import ensure_prompt
from radixchat.tui.tool_actions import declare_tools
from radixchat.tui.widgets.assistant_message import AssistantMessage, decorate_footer
from radixchat.tui.widgets.user_message import UserMessage

if TYPE_CHECKING:
    from radixchat.tui.app import RadixChatApp

    _Base = RadixChatApp
else:
    _Base = object


class ChatActions(_Base):
    # -- modes --------------------------------------------------------------------------------------------

    async def action_set_mode(self, mode: Mode) -> None:
        if mode not in MODES:
            return
        self.state.mode = mode
        await self.probe_mode()
        self.update_status()
        if self.mode_problem and not self.offer_lenient(self.mode_problem):
            self.notify(self.mode_problem, title=f"{mode} mode", severity="warning")
        elif not self.mode_problem:
            self.lenient_notice()

    async def action_cycle_mode(self) -> None:
        await self.action_set_mode(self.state.next_mode())

    async def probe_mode(self) -> None:
        """Ask the grammar layer whether the mode can be used now, to show why not before a send."""
        self.mode_problem = None
        if self.backend is not None and self.state.mode != "chat":
            result = await self._grammar()
            self.mode_problem = result if isinstance(result, str) else None

    async def _grammar(self) -> Any:
        """A matcher for the next reply (None: unconstrained) or the ModeError's message. In tool mode
        this only checks the tools and tool_choice: ``run_tool_turn`` makes a matcher per round."""
        s = self.state
        tools = self.tool_declarations() if s.mode == "tool" else None
        try:
            return await asyncio.to_thread(
                grammar_for,
                self.backend,
                s.mode,
                s.schema,
                tools,
                s.tool_choice,
                s.lenient and s.mode == "json",
            )
        except ModeError as exc:
            return str(exc)

    def offer_lenient(self, problem: str) -> bool:
        """A strict schema failed on what only lenient mode can run: ask the user (True: asked)."""
        s = self.state
        if s.mode != "json" or s.lenient or not ("unsupported " in problem or "not provably" in problem):
            return False

        def answer(yes: bool | None) -> None:
            if yes:
                s.lenient = True
                self.run_worker(self.action_set_mode("json"))

        question = (
            f"{problem}\n\nRun this schema leniently? The grammar enforces what it can; each reply is then "
            "checked against the whole schema and what it breaks is shown."
        )
        self.push_screen(ConfirmDialog(question, yes="Run leniently"), answer)
        return True

    def lenient_notice(self) -> None:
        s = self.state
        if s.mode == "json" and s.lenient:
            missing = unenforced_keywords(s.schema) or ["a oneOf whose branches may overlap"]
            self.notify(
                "Not enforced while generating (checked after each reply): " + "; ".join(missing),
                title="Lenient JSON mode",
                severity="warning",
                timeout=12,
            )

    def action_mode_input(self) -> None:
        if self.state.mode == "json":
            self.action_edit_schema()
        else:
            self.action_show_tools()

    def action_edit_schema(self) -> None:
        def done(result: tuple[Any] | None) -> None:
            if result is not None:
                self.state.schema, self.state.lenient = result[0], False
                self.notify(
                    "Replies follow the schema" if result[0] is not None else "Replies are any JSON",
                    title="JSON mode",
                )
                self.run_worker(self.action_set_mode("json"))

        self.push_screen(SchemaScreen(self.state.schema), done)

    # -- turns --------------------------------------------------------------------------------------------

    async def on_prompt_submitted(self, event: PromptSubmitted) -> None:
        if await self.send(event.text):
            self.prompt.accept(event.text)

    async def send(self, text: str) -> bool:
        """Send ``text`` as a user message (into a new branch when editing). False: nothing was sent."""
        s = self.state
        if self.backend is None and self.return_code_on_quit == 0:
            return await self._queue(text)
        if not self._can_start():
            return False
        grammar = await self._grammar()
        if isinstance(grammar, str):
            self.mode_problem = grammar
            self.update_status()
            if not self.offer_lenient(grammar):
                self.notify(
                    f"{grammar} — switch mode with Ctrl+T. Your message is kept.",
                    title=f"{s.mode} mode",
                    severity="error",
                )
            return False
        editing = s.editing
        conv = s.conv.truncated(editing) if editing is not None else s.conv
        n, tools = len(conv.messages), conv.tools
        tool_mode = s.mode == "tool"
        try:
            if tool_mode:
                declare_tools(conv, self.tool_declarations())
            conv.add_user(text)
            reply = (
                None
                if tool_mode
                else self.backend.reply(conv, make_params(self.settings, s.sampling), grammar)
            )
        except RadixchatError as exc:
            del conv.messages[n:]
            conv.tools = tools
            self.notify(str(exc), title="Not sent", severity="error")
            return False
        new = [] if editing is not None else [UserMessage(conv.messages[-1], n)]
        if editing is not None:
            s.fork(conv, f"edit of message {editing}")
        if tool_mode:
            await self.start_tool_turn(*new, rebuild=editing is not None)
        else:
            await self._start_reply(reply, *new, rebuild=editing is not None)
        return True

    async def _queue(self, text: str) -> bool:
        """Enter while the model loads: show the message now, send it once the engine is ready."""
        if self.queued is not None:
            self.notify("A message is already waiting for the model.", severity="warning")
            return False
        self.queued = text
        view = UserMessage(Message("user", text), -1, classes="-queued")
        view.border_subtitle = "sends when the model is ready"
        await self.transcript.add(view)
        return True

    async def send_queued(self) -> None:
        """The engine is ready: send what was queued (back into the prompt if it cannot go)."""
        text, self.queued = self.queued, None
        if text is None:
            return
        for view in self.transcript.query(".-queued"):
            await view.remove()
        if not await self.send(text):
            self.prompt.load_text(text)

    def _can_start(self) -> bool:
        if self.backend is None or self.state.conv is None:
            self.notify(
                f"The model is not ready yet ({self.load_status}). Your message is kept.", severity="warning"
            )
            return False
        if self._reply is not None:
            self.notify("A reply is still being generated — Esc stops it.", severity="warning")
            return False
        return True

    async def _start_reply(self, reply: Any, *new: UserMessage, rebuild: bool = False) -> None:
        conv = self.state.conv
        view = AssistantMessage(Message("assistant", ""), len(conv.messages), self.state.mode, streaming=True)
        if rebuild:
            await self.transcript.show(conv.messages)
        await self.transcript.add(*new, view)
        self._reply, self._reply_view = reply, view
        self.state.editing = None
        self.update_status()
        self.stream_reply(reply, view, self.state.mode)

    @work(group="reply", exit_on_error=False)
    async def stream_reply(self, reply: Any, view: AssistantMessage, mode: str) -> None:
        result, error = None, None
        try:
            await view.stream_from(reply)
            result = await reply.result()
        except Exception as exc:  # the backend broke mid-stream: keep what came, say why
            error = f"{type(exc).__name__}: {exc}"
        finally:
            self._reply = self._reply_view = None
        if not view.is_attached:  # the app closed under the reply
            return
        if result is None:
            await view.finish(
                Message("assistant", "".join(view.streamed), finish_reason="error"), f"error: {error}", mode
            )
        else:
            result.message.meta["mode"] = mode
            partial = bool(result.message.meta.get("partial"))
            await view.finish(
                result.message,
                decorate_footer(result.footer(), result.finish_reason, result.error, partial),
                mode,
            )
            self.state.record_turn(
                result.prompt_tokens, result.cached_tokens, result.ttft_ms, result.decode_tokens_per_s
            )
        self.post_message(TurnFinished(result))

    async def on_turn_finished(self, event: TurnFinished) -> None:
        if self.backend is None:  # shutting down
            return
        self.update_status()
        result = event.result
        if result is not None and result.finish_reason == "error":
            self.notify(result.error or "the reply failed", title="Reply failed", severity="error")
        elif result is not None and self.state.mode == "json" and self.state.lenient:
            errors = await asyncio.to_thread(schema_errors, self.state.schema, result.message.content)
            if errors:
                self.notify(
                    "\n".join(errors), title="The reply breaks the schema", severity="warning", timeout=15
                )
        await self.autosave()
        self.refresh_panels()
        self.turns_finished += 1  # last: a turn is over for tests and scripts once this moves

    def action_stop(self) -> None:
        if self._reply is not None:
            self._reply.cancel()
            if self._reply_view is not None and self._reply_view.streaming:
                self._reply_view.set_footer("stopping…")
        elif self.state.editing is not None:
            self.state.editing = None
            self.prompt.clear()
            self.update_status()
        elif self.focused is not self.prompt:
            self.prompt.focus()

    async def stop_reply(self) -> None:
        """Stop any reply, wait until its text is kept, and save it (before switching conversations: the
        end-of-turn autosave would run only after the switch)."""
        if self._reply is not None:
            self._reply.cancel()
            await self.workers.wait_for_complete([w for w in self.workers if w.group == "reply"])
            await self.autosave()

    async def on_regenerate_requested(self, event: RegenerateRequested) -> None:
        await self.action_regenerate()

    async def action_regenerate(self) -> None:
        """The last turn again, from the user's last message (with its tool calls, in tool mode)."""
        s = self.state
        if not self._can_start():
            return
        conv = s.conv
        users = [i for i, m in enumerate(conv.messages) if m.role == "user"]
        if not users:
            self.notify("Nothing to regenerate yet", severity="warning")
            return
        grammar = await self._grammar()
        if isinstance(grammar, str):
            self.notify(grammar, title=f"{s.mode} mode", severity="error")
            return
        forked = users[-1] < len(conv.messages) - 1
        new = conv.truncated(users[-1] + 1) if forked else conv
        tools = new.tools
        try:
            ensure_prompt(new)
            if s.mode == "tool":
                declare_tools(new, self.tool_declarations())
                reply = None
            else:
                reply = self.backend.reply(new, make_params(self.settings, s.sampling), grammar)
        except RadixchatError as exc:
            new.tools = tools
            self.notify(str(exc), title="Not regenerated", severity="error")
            return
        if forked:
            s.fork(new, f"regenerated reply {len(users)}")
        if s.mode == "tool":
            await self.start_tool_turn(rebuild=True)
        else:
            await self._start_reply(reply, rebuild=True)

    def on_edit_requested(self, event: EditRequested) -> None:
        self._edit(event.index)

    def action_edit_last(self) -> None:
        conv = self.state.conv
        users = [i for i, m in enumerate(conv.messages) if m.role == "user"] if conv else []
        if users:
            self._edit(users[-1])

    def _edit(self, index: int) -> None:
        if self._reply is not None:
            self.notify("Stop the reply first (Esc)", severity="warning")
            return
        self.state.editing = index
        self.prompt.load_text(self.state.conv.messages[index].content)
        self.prompt.move_cursor(self.prompt.document.end)
        self.prompt.focus()
        self.update_status()

    # -- branches -----------------------------------------------------------------------------------------

    def action_branches(self) -> None:
        async def done(index: int | None) -> None:
            if index is not None:
                await self.switch_branch(index)

        self.push_screen(BranchesScreen(self.state.branches, self.state.active), done)

    async def action_cycle_branch(self, step: int) -> None:
        if len(self.state.branches) > 1:
            await self.switch_branch((self.state.active + step) % len(self.state.branches))

    async def switch_branch(self, index: int) -> None:
        await self.stop_reply()
        self.state.switch(index)
        await self.transcript.show(self.state.conv.messages)
        self.update_status()
        self.refresh_panels()

    def action_copy_last(self) -> None:
        view = self.transcript.last_assistant()
        if view is not None:
            view.action_copy()
