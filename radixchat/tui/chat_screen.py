"""The chat screen: the conversation, its transcript, and the reply in flight.

The app (``radixchat.tui.app``) holds the settings, loads the backend and tells this screen when it is
ready (``backend_ready``); everything about the conversation happens here. What needs no Textual (the
backend, whose one owner it is, the session state, the tools offered, the mode's constraint) is the
screen's ``ChatCore`` (``tui/chat_core.py``); the screen draws it and routes keys to the controllers. A reply streams in a worker on
the event loop (the model runs in the engine's thread, or on a server); Esc cancels it and what was
generated is kept: the turns (send, regenerate, edit, stop) are ``TurnControl``'s, which holds the reply
in flight. Each finished turn is saved (the core's ``SessionKeeper``); the session actions (save as, open, new chat,
export, the per-session settings) are ``SessionControl``'s; lenient JSON mode is ``tui/lenient.py``'s.
The side panel shows ``backend.stats()`` and ``backend.cached_path()`` (or ``backend.totals()`` for a
backend without an engine), refreshed on the app's timer.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.screen import Screen
from textual.widgets import Footer

from radixchat.chat.backend import ChatBackend
from radixchat.chat.modes import MODES, Mode, ModeError
from radixchat.chat.session import SessionFile
from radixchat.chat.tools import ToolRegistry
from radixchat.config import Settings
from radixchat.tui.attach_control import AttachControl
from radixchat.tui.chat_core import ChatCore
from radixchat.tui.context import context_use
from radixchat.tui.in_flight import ReplyInFlight
from radixchat.tui.lenient import check_reply, lenient_notice, offer_lenient
from radixchat.tui.messages import (
    ChatShown,
    EditRequested,
    PromptSubmitted,
    RegenerateRequested,
    TurnFinished,
)
from radixchat.tui.session_control import SessionControl
from radixchat.tui.state import ChatState, display_messages
from radixchat.tui.tools import choice_label
from radixchat.tui.turn_control import TurnControl
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.attachment_bar import AttachmentBar
from radixchat.tui.widgets.prompt import PromptHistory, PromptInput
from radixchat.tui.widgets.side_panel import SidePanel
from radixchat.tui.widgets.status_bar import StatusBar, StatusInfo
from radixchat.tui.widgets.transcript import Transcript
from radixchat.tui.widgets.welcome import Welcome

NARROW = 110  # columns below which the side panel hides itself
MIN_PANELS = 80  # columns below which it cannot be shown at all (it is 44 wide; the chat needs the rest)


class ChatScreen(Screen[None]):
    CSS_PATH = "chat_screen.tcss"
    BINDINGS = [
        Binding("f1", "app.help", "Help", id="help"),
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+t", "cycle_mode", "Mode", id="mode.cycle"),
        Binding("f4", "mode_input", "Schema/tools", id="mode.input", show=False),
        Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate"),
        Binding("ctrl+n", "new_chat", "New chat", id="new", show=False),
        Binding("ctrl+s", "save", "Save", id="session.save"),
        Binding("ctrl+o", "sessions", "Sessions", id="session.open"),
        Binding("ctrl+b", "toggle_panels", "Panels", id="panels"),
        Binding("f2", "settings", "Settings", id="settings", show=False),
        Binding("f3", "branches", "Branches", id="branches", show=False),
        Binding("f6", "app.toggle_thinking", "Thinking", id="thinking.toggle", show=False, priority=True),
        # Not Ctrl+Y: the prompt (a TextArea) takes it for redo, so it did nothing there.
        Binding("ctrl+g", "copy_last", "Copy reply", id="copy.last", show=False),
        Binding("f8", "attach_file", "Attach file", id="attach.pick", show=False),
        Binding("f7", "app.pick_model", "Switch model", id="model.pick", show=False, priority=True),
    ]

    def __init__(self, settings: Settings, session: SessionFile | str | None = None) -> None:
        super().__init__()
        self.core = ChatCore(settings, session)
        self.sessions = SessionControl(self.core, self)
        self.turns = TurnControl(self.core, self)
        self.attach = AttachControl(self.core, self)
        self.turns_finished = 0  # replies fully handled (rendered, autosaved)
        self._panels_on: bool | None = None  # None: automatic (by width)
        self._narrow: bool | None = None

    # -- layout -------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield StatusBar(id="status")
                yield AttachmentBar(id="attachments")
                yield PromptInput(
                    PromptHistory(), id="prompt", placeholder="Message (Enter sends, Ctrl+J newline)"
                )
            yield SidePanel(id="side")
        yield Footer(compact=True)

    # What the core holds, as the screen's readers (the app, tests) ask for it.

    @property
    def state(self) -> ChatState:
        return self.core.state

    @property
    def backend(self) -> ChatBackend | None:
        return self.core.backend

    @property
    def registry(self) -> ToolRegistry:
        return self.core.registry

    @property
    def mode_problem(self) -> str | None:
        return self.core.mode_problem

    @property
    def load_status(self) -> str:
        return self.core.load_status

    async def on_mount(self) -> None:
        pending = self.core.pending_session
        messages = display_messages(pending) if pending else []
        if pending:
            self.state.adopt(pending)
            self.prompt.prompts = PromptHistory([m.content for m in messages if m.role == "user"])
        await self.transcript.show(messages, self.welcome())
        self.prompt.focus()
        self.update_status()
        self.post_message(ChatShown())

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    def welcome(self) -> Welcome:
        """A fresh welcome panel (shown while the chat is empty)."""
        return Welcome(self.core.model_name, self.load_status, error=self.core.load_failed)

    def set_load_status(self, text: str, error: bool = False) -> None:
        self.core.load_status = text
        for w in self.transcript.query(Welcome):
            w.set_status(text, error)
        self.update_status()

    def update_status(self, activity: str | None = None) -> None:
        bars = self.query(StatusBar)
        if not bars:  # the app is closing (a reply can end after the widgets went)
            return
        s = self.state
        if activity is None:
            if self.core.loading is not None:
                activity = self.core.loading
            elif self.in_flight is not None:
                activity = "generating… (Esc stops)"
            elif s.editing is not None:
                activity = f"editing message {s.editing} — Enter sends it as a new branch, Esc cancels"
            elif s.mode == "json" and not self.mode_problem:
                activity = ("schema set" if s.schema is not None else "any JSON") + " · F4 edits the schema"
            elif s.mode == "tool" and not self.mode_problem:
                n = len(self.core.offered_tools())
                activity = f"{n} tool{'' if n == 1 else 's'} · tool_choice {choice_label(s.tool_choice)} · F4 chooses"
            else:
                activity = ""
        branch = (s.active + 1, max(len(s.branches), 1))
        info = StatusInfo(s.mode, self.mode_problem, self.core.model_name, s.session_name, branch, activity)
        bars.first().show(info, context_use(self.backend, s.conv))

    # -- the backend ----------------------------------------------------------------------------------------

    async def backend_ready(self, backend: ChatBackend) -> None:
        """The app loaded and started ``backend``: continue the pending session or start a chat."""
        self.core.adopt(backend)
        self.set_load_status(f"ready · {backend.model_name}")
        if self.core.pending_session is not None:
            session, self.core.pending_session = self.core.pending_session, None
            await self.open_session(session)
        else:
            self.state.reset(backend.new_conversation(system=self.state.system_prompt))
        await self.probe_mode()
        self.update_status()
        self.refresh_panels()
        await self.turns.send_queued()

    def backend_failed(self, error: str) -> None:
        self.core.load_failed = True
        self.set_load_status(f"the model failed to load: {error} — Ctrl+Q quits", error=True)

    # -- panels -------------------------------------------------------------------------------------------

    def on_resize(self, event: Resize) -> None:
        narrow = event.size.width < NARROW
        if narrow != self._narrow:
            self._narrow, self._panels_on = narrow, None
        self._layout_panels(event.size.width)

    def _layout_panels(self, width: int | None = None) -> None:
        on = self._panels_on if self._panels_on is not None else not self._narrow
        self.query_one(SidePanel).display = on and (width or self.size.width) >= MIN_PANELS

    def action_toggle_panels(self) -> None:
        if not self.query_one(SidePanel).display and self.size.width < MIN_PANELS:
            self.notify(f"The panels need a window at least {MIN_PANELS} columns wide.", title="Panels")
            return
        self._panels_on = not self.query_one(SidePanel).display
        self._layout_panels()
        self.refresh_panels()

    def refresh_panels(self) -> None:
        panel = self.query_one(SidePanel)
        if self.backend is not None and panel.display and panel.due(streaming=self.in_flight is not None):
            self.run_worker(self.refresh_panels_now(), group="panels", exit_on_error=False)

    async def refresh_panels_now(self) -> None:
        if self.backend is not None:
            await self.query_one(SidePanel).refresh_from(self.backend, self.state)

    # -- modes --------------------------------------------------------------------------------------------

    async def action_set_mode(self, mode: Mode) -> None:
        if mode not in MODES:
            return
        self.state.mode = mode
        await self.probe_mode()
        self.update_status()
        problem = self.core.mode_error
        if problem and not self.offer_lenient(problem):
            self.notify(str(problem), title=f"{mode} mode", severity="warning")
        elif not problem:
            lenient_notice(self, self.state)

    async def action_cycle_mode(self) -> None:
        await self.action_set_mode(self.state.next_mode())

    async def probe_mode(self) -> None:
        """Find whether the mode can be used now, to show why not before a send."""
        await self.core.probe_mode()

    def offer_lenient(self, problem: ModeError) -> bool:
        """Offer to run a schema that strict mode refused leniently (True: the user is asked)."""
        return offer_lenient(self, self.state, problem)

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

        from radixchat.tui.screens.schema import SchemaScreen  # modal screens load where they open

        self.app.push_screen(SchemaScreen(self.state.schema), done)

    # -- tools --------------------------------------------------------------------------------------------

    def action_show_tools(self) -> None:
        self.sessions.edit_tools()

    # -- turns (``TurnControl``) ---------------------------------------------------------------------------

    @property
    def in_flight(self) -> ReplyInFlight | None:
        """The turn being generated (Esc stops it)."""
        return self.turns.in_flight

    @property
    def reply_view(self) -> AssistantMessage | None:
        """The message the reply in flight streams into (None between a tool turn's rounds)."""
        return self.in_flight.view if self.in_flight is not None else None

    async def on_prompt_submitted(self, event: PromptSubmitted) -> None:
        message = await self.attach.message(event.text)  # None: a file cannot be attached (said why)
        if message is not None and await self.turns.send(message):
            self.prompt.accept(event.text)

    def on_text_area_changed(self) -> None:  # the prompt is the screen's only text area
        measure = partial(self.attach.measure, self.prompt.text, self.query_one(AttachmentBar))
        self.run_worker(measure, group="attachments", exclusive=True)  # a callable: one superseded never runs

    def action_attach_file(self) -> None:
        self.attach.pick()

    async def on_turn_finished(self, event: TurnFinished) -> None:
        if self.backend is None:  # shutting down
            return
        self.update_status()
        result = event.result
        if result is not None and result.finish_reason == "error":
            self.notify(result.error or "the reply failed", title="Reply failed", severity="error")
        elif result is not None:
            await check_reply(self, self.state, result)
        await self.sessions.autosave()
        self.refresh_panels()
        self.turns_finished += 1  # last: a turn is over for tests and scripts once this moves

    def action_stop(self) -> None:
        if self.turns.stop():
            return
        if self.state.editing is not None:
            self.state.editing = None
            self.prompt.clear()
            self.update_status()
        elif self.focused is not self.prompt:
            self.prompt.focus()

    async def stop_reply(self) -> None:
        """Stop any reply, wait until its text is kept, and save it (before switching conversations: the
        end-of-turn autosave would run only after the switch)."""
        if self.turns.stop():
            await self.workers.wait_for_complete([w for w in self.workers if w.group == "reply"])
            await self.sessions.autosave()

    async def on_regenerate_requested(self, event: RegenerateRequested) -> None:
        await self.action_regenerate()

    async def action_regenerate(self) -> None:
        await self.turns.regenerate()

    def on_edit_requested(self, event: EditRequested) -> None:
        self.turns.edit(event.index)

    def action_edit_last(self) -> None:
        conv = self.state.conv
        users = [i for i, m in enumerate(conv.messages) if m.role == "user"] if conv else []
        if users:
            self.turns.edit(users[-1])

    # -- branches -----------------------------------------------------------------------------------------

    def action_branches(self) -> None:
        async def done(index: int | None) -> None:
            if index is not None:
                await self.switch_branch(index)

        from radixchat.tui.screens.branches import BranchesScreen

        self.app.push_screen(BranchesScreen(self.state.branches, self.state.active), done)

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

    # -- sessions (``SessionControl``) ----------------------------------------------------------------------

    async def open_session(self, session: SessionFile) -> None:
        await self.sessions.open(session)

    @work(group="session-save", exclusive=True)
    async def action_save(self, ask: bool = False) -> None:
        await self.sessions.save(ask)

    def action_save_as(self) -> None:
        self.action_save(ask=True)

    def action_sessions(self) -> None:
        self.sessions.browse()

    async def action_new_chat(self) -> None:
        await self.sessions.new_chat()

    async def action_export_markdown(self) -> None:
        await self.sessions.export_markdown()

    def action_settings(self) -> None:
        self.sessions.edit_settings()

    async def action_apply_preset(self, name: str) -> None:
        await self.sessions.apply_preset(name)
