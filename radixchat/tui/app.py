"""The chat app: wires the widgets, the backend and the session state together.

The backend (engine + model) loads in a thread worker while the window is already up; model steps run in
the engine's own thread, so the event loop only moves text and numbers. Everything the panels show comes
from ``backend.stats()`` and ``backend.cached_path()``, polled at ``panel_interval`` (off in tests).
"""

from __future__ import annotations

import asyncio
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize
from textual.widgets import Footer

from radixchat.chat.session import SessionFile, load_session, session_path
from radixchat.config import Settings
from radixchat.errors import RadixchatError
from radixchat.exit_codes import ExitCode
from radixchat.tui.backend import BackendFactory, load_backend
from radixchat.tui.chat_actions import ChatActions
from radixchat.tui.commands import ChatCommands
from radixchat.tui.keymap import binding_groups, check_keymap
from radixchat.tui.messages import (
    EngineFailed,
    EngineProgress,
    EngineReady,
)
from radixchat.tui.screens.help import HelpScreen
from radixchat.tui.session_actions import SessionActions
from radixchat.tui.state import ChatState, display_messages
from radixchat.tui.tool_actions import ToolActions
from radixchat.tui.tools import build_registry
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.prompt import PromptHistory, PromptInput
from radixchat.tui.widgets.side_panel import RemoteView, SidePanel
from radixchat.tui.widgets.status_bar import StatusBar, StatusInfo
from radixchat.tui.widgets.transcript import Transcript
from radixchat.tui.widgets.welcome import Welcome

NARROW = 110  # columns below which the side panel hides itself
MIN_PANELS = 80  # columns below which it cannot be shown at all (it is 44 wide; the chat needs the rest)


class RadixChatApp(ChatActions, ToolActions, SessionActions, App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "radixchat"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [
        Binding("f1", "help", "Help", id="help"),
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
        # Not Ctrl+Y: the prompt (a TextArea) takes it for redo, so it did nothing there.
        Binding("ctrl+g", "copy_last", "Copy reply", id="copy.last", show=False),
        # Textual's own two, given ids so that F1 lists them and [keymap] can move them ("palette" is
        # the word Textual's footer shows).
        Binding(
            "ctrl+p",
            "command_palette",
            "palette",
            id="palette",
            show=False,
            priority=True,
            tooltip="Open the command palette",
        ),
        Binding("ctrl+q", "quit", "Quit", id="quit", show=False, priority=True),
    ]

    def __init__(
        self,
        settings: Settings,
        *,
        session: SessionFile | str | None = None,
        backend_factory: BackendFactory | None = None,
        panel_interval: float | None = 0.5,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.backend_factory = backend_factory or load_backend
        self.panel_interval = panel_interval
        self.backend: Any = None
        self.state = ChatState(model=settings.model, system_prompt=settings.system_prompt)
        self.registry, self._tools_problem = build_registry(settings)
        self.mode_problem: str | None = None
        self.load_status = "starting"
        self._pending: SessionFile | None = session if isinstance(session, SessionFile) else None
        if isinstance(session, str):  # a name with no file yet: a new session by that name
            self.state.session_name = session
        self._reply: Any = None
        self._reply_view: AssistantMessage | None = None
        self.queued: str | None = None  # sent with Enter before the model was ready
        self.turns_finished = 0  # replies fully handled (rendered, autosaved)
        self._panels_on: bool | None = None  # None: automatic (by width)
        self._narrow: bool | None = None
        self._refreshing = False
        self.return_code_on_quit = 0

    # -- layout -------------------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            with Vertical(id="chat"):
                yield Transcript(id="transcript")
                yield StatusBar(id="status")
                yield PromptInput(
                    PromptHistory(), id="prompt", placeholder="Message (Enter sends, Ctrl+J newline)"
                )
            yield SidePanel(id="side")
        yield Footer(compact=True)

    async def on_mount(self) -> None:
        self.apply_look()
        self.load_status = "loading the model…"
        messages = display_messages(self._pending) if self._pending else []
        if self._pending:
            self.state.adopt(self._pending)
            self.prompt.prompts = PromptHistory([m.content for m in messages if m.role == "user"])
        await self.transcript.show(messages, self.welcome())
        self.prompt.focus()
        self.update_status()
        self.load_backend()
        if self.panel_interval:
            self.set_interval(self.panel_interval, self.refresh_panels)

    def apply_look(self) -> None:
        """The theme and keymap of the config file (``theme``, ``[keymap]``); what does not fit is said."""
        theme = self.settings.theme
        if theme is not None:
            if theme in self.available_themes:
                self.theme = theme
            else:
                known = ", ".join(sorted(self.available_themes))
                self.notify(f"unknown theme '{theme}' (known: {known})", title="Config", severity="warning")
        keymap = self.settings.keymap
        if keymap:
            self.set_keymap(keymap)
            problem = check_keymap(keymap)
            if problem:
                self.notify(problem, title="Config", severity="warning", timeout=10)
        if self._tools_problem:
            self.notify(self._tools_problem, title="Config", severity="warning", timeout=10)

    def welcome(self) -> Welcome:
        """A fresh welcome panel (shown while the chat is empty)."""
        return Welcome(
            self.backend.model_name if self.backend else self.settings.model,
            self.load_status,
            error=self.return_code_on_quit == ExitCode.MODEL,
        )

    def set_load_status(self, text: str, error: bool = False) -> None:
        self.load_status = text
        for w in self.transcript.query(Welcome):
            w.set_status(text, error)
        self.update_status()

    @property
    def transcript(self) -> Transcript:
        return self.query_one(Transcript)

    @property
    def prompt(self) -> PromptInput:
        return self.query_one(PromptInput)

    def update_status(self, activity: str | None = None) -> None:
        bars = self.query(StatusBar)
        if not bars:  # the app is closing (a reply can end after the widgets went)
            return
        s = self.state
        if activity is None:
            if self.backend is None:
                activity = self.load_status
            elif self._reply is not None:
                activity = "generating… (Esc stops)"
            elif s.editing is not None:
                activity = f"editing message {s.editing} — Enter sends it as a new branch, Esc cancels"
            elif s.mode == "json" and not self.mode_problem:
                activity = ("schema set" if s.schema is not None else "any JSON") + " · F4 edits the schema"
            elif s.mode == "tool" and not self.mode_problem:
                activity = self.tool_activity()
            else:
                activity = ""
        info = StatusInfo(
            s.mode,
            self.mode_problem,
            self.backend.model_name if self.backend else self.settings.model,
            s.session_name,
            (s.active + 1, max(len(s.branches), 1)),
            activity,
        )
        bars.first().show(info)

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

    def action_focus_prompt(self) -> None:
        self.prompt.focus()

    def action_help(self) -> None:
        self.push_screen(HelpScreen(binding_groups()))

    # -- the backend --------------------------------------------------------------------------------------

    @work(thread=True, exit_on_error=False, group="load")
    def load_backend(self) -> None:
        try:
            backend = self.backend_factory(
                self.settings, lambda text: self.post_message(EngineProgress(text))
            )
        except RadixchatError as exc:
            self.post_message(EngineFailed(str(exc)))
            return
        except Exception as exc:  # a bug: say so in the window rather than die silently
            self.post_message(EngineFailed(f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(EngineReady(backend))

    def on_engine_progress(self, event: EngineProgress) -> None:
        self.set_load_status(event.text)

    def on_engine_failed(self, event: EngineFailed) -> None:
        self.return_code_on_quit = ExitCode.MODEL
        self.set_load_status(f"the model failed to load: {event.error} — Ctrl+Q quits", error=True)
        self.notify(event.error, title="Model failed to load", severity="error", timeout=30)

    async def on_engine_ready(self, event: EngineReady) -> None:
        backend = event.backend
        await backend.start()
        self.backend = backend
        self.state.model = backend.model_name
        self.set_load_status(f"ready · {backend.model_name}")
        if self._pending is not None:
            session, self._pending = self._pending, None
            await self.open_session(session)
        else:
            self.state.reset(backend.new_conversation(system=self.state.system_prompt))
        await self.probe_mode()
        self.update_status()
        self.refresh_panels()
        await self.send_queued()

    async def shutdown(self) -> None:
        if self._reply is not None:
            self._reply.cancel()
        if self.backend is not None:
            backend, self.backend = self.backend, None
            await backend.aclose()

    async def action_quit(self) -> None:
        await self.stop_reply()  # keeps and saves the prompt and what came of the reply, as Esc would
        await self.shutdown()
        code = self.return_code_on_quit
        self.exit(code, return_code=code)

    async def on_unmount(self) -> None:
        await self.shutdown()

    # -- panels -------------------------------------------------------------------------------------------

    def refresh_panels(self) -> None:
        if self.backend is not None and self.query_one(SidePanel).display and not self._refreshing:
            self.run_worker(self.refresh_panels_now(), group="panels", exit_on_error=False)

    async def refresh_panels_now(self) -> None:
        backend, conv = self.backend, self.state.conv
        if backend is None:
            return
        ids = conv.ids if conv is not None else []
        self._refreshing = True
        try:
            stats, path = await asyncio.to_thread(lambda: (backend.stats(), backend.cached_path(ids)))
        finally:
            self._refreshing = False
        panels = self.query(SidePanel)
        if not panels:
            return
        if stats is None:
            s = self.state
            panels.first().show_remote(
                RemoteView(
                    backend.base_url or "the server",
                    backend.model_name,
                    backend.cache_tree_note or "The KV cache tree lives on the server.",
                    backend.totals(),
                    list(s.hit_history),
                    s.last_hit,
                    *s.last_speed,
                )
            )
        else:
            panels.first().show(stats, path, list(self.state.hit_history))


def run_app(
    settings: Settings, session: str | None = None, backend_factory: BackendFactory | None = None
) -> int:
    """Run the chat app; returns the exit code. A session file that exists but does not load is an error
    here (exit 2 from the CLI), so a corrupt file is never overwritten by autosave."""
    initial: SessionFile | str | None = session
    if session is not None:
        path = session_path(settings.sessions_dir, session)
        if path.exists():
            initial = load_session(path)  # raises SessionError: one line, exit 2
    app = RadixChatApp(settings, session=initial, backend_factory=backend_factory)
    app.run()
    return app.return_code or 0


__all__ = ["RadixChatApp", "run_app"]
