"""The chat app: settings, loading the backend, theme and keymap, and the panel timer.

Everything about the conversation lives on the chat screen (``chat_screen.py``), the app's default
screen: App → ChatScreen → widgets. The backend (engine + model, or a remote server) loads in a thread worker
while the window is already up and typeable; model steps run in the engine's own thread, so the event
loop only moves text and numbers.
"""

from __future__ import annotations

from textual import work
from textual.app import App

from radixchat.chat.backend import ChatBackend
from radixchat.chat.model_catalog import remember
from radixchat.chat.session import SessionFile, load_session, session_path
from radixchat.config import Settings
from radixchat.errors import RadixchatError
from radixchat.exit_codes import ExitCode
from radixchat.tui.backend import BackendFactory, load_backend
from radixchat.tui.chat_screen import ChatScreen
from radixchat.tui.commands import ChatCommands
from radixchat.tui.keymap import APP_BINDINGS, binding_groups, check_keymap
from radixchat.tui.messages import (
    ChatShown,
    EngineFailed,
    EngineProgress,
    EngineReady,
    SwitchModelRequested,
)
from radixchat.tui.model_control import ModelControl, announce
from radixchat.tui.screens.help import HelpScreen
from radixchat.tui.widgets.thinking import toggle_thinking


class RadixChatApp(App[int]):
    # Textual reads the CSS_PATH of screens it pushes, not of the default screen: the chat screen's is
    # read here.
    CSS_PATH = "chat_screen.tcss"
    TITLE = "radixchat"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = APP_BINDINGS

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
        # The config file's [keymap] as applied (binding id -> keys): F1 and the text boxes that run
        # bindings themselves (``widgets/ordered_keys.py``) read it here, not in Textual's private state.
        self.keymap: dict[str, str] = {}
        self.panel_interval = panel_interval
        self.chat = ChatScreen(settings, session)
        chat = self.chat
        # Switching the model is loading a backend too: the app's, with the same factory.
        self.models = ModelControl(chat.core, chat, chat.sessions, chat.turns, self.backend_factory)
        self.return_code_on_quit = 0

    @property
    def backend(self) -> ChatBackend | None:
        """The loaded backend (None until then, and once shut down). Its one owner is the chat screen's
        ``ChatCore``; the app only loads it and closes it."""
        return self.chat.core.backend

    def get_default_screen(self) -> ChatScreen:
        return self.chat

    def on_mount(self) -> None:
        self.apply_look()

    def on_chat_shown(self, event: ChatShown) -> None:
        # After the first frame: the loader's imports (openai, torch) would hold the GIL while it draws.
        self.call_after_refresh(self.load_backend)
        if self.chat.core.mcp is not None:  # in the background too: no server holds the window up
            self.run_worker(self.chat.core.mcp.start(self.mcp_notice), group="mcp", exit_on_error=False)
        if self.panel_interval:
            self.set_interval(self.panel_interval, self.chat.refresh_panels)

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
            self.keymap = dict(keymap)
            self.set_keymap(self.keymap)
            problem = check_keymap(keymap)
            if problem:
                self.notify(problem, title="Config", severity="warning", timeout=10)
        if self.chat.core.tools_problem:
            self.notify(self.chat.core.tools_problem, title="Config", severity="warning", timeout=10)

    def mcp_notice(self, text: str) -> None:
        self.notify(text, title="MCP", severity="warning", timeout=10)

    def action_help(self) -> None:
        self.push_screen(HelpScreen(binding_groups(), self.keymap))

    def action_toggle_thinking(self) -> None:
        """F6: show or hide every reply's thinking (folded by default)."""
        shown = toggle_thinking(self)
        self.notify("Thinking shown" if shown else "Thinking hidden", timeout=1.5)

    def action_pick_model(self) -> None:
        self.models.pick()

    def on_switch_model_requested(self, event: SwitchModelRequested) -> None:
        self.run_worker(self.models.switch(event.spec), group="model-switch", exit_on_error=False)

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
        if backend.base_url is None:  # a model file or folder goes into the picker's recent list
            remember(self.settings.cache_dir, self.settings.model, backend.model_name)
        self.post_message(EngineReady(backend))

    def on_engine_progress(self, event: EngineProgress) -> None:
        self.chat.set_load_status(event.text)

    def on_engine_failed(self, event: EngineFailed) -> None:
        self.return_code_on_quit = ExitCode.MODEL
        self.chat.backend_failed(event.error)
        self.notify(event.error, title="Model failed to load", severity="error", timeout=30)

    async def on_engine_ready(self, event: EngineReady) -> None:
        backend = event.backend
        await backend.start()
        await self.chat.backend_ready(backend)
        announce(self, backend)

    async def shutdown(self) -> None:
        if self.chat.in_flight is not None:
            self.chat.in_flight.cancel()
        backend = self.chat.core.release()
        if backend is not None:
            await backend.aclose()
        if self.chat.core.mcp is not None:  # stdio servers stop with the app
            await self.chat.core.mcp.aclose()

    async def action_quit(self) -> None:
        await self.chat.stop_reply()  # keeps and saves the prompt and what came of the reply, as Esc would
        await self.shutdown()
        code = self.return_code_on_quit
        self.exit(code, return_code=code)

    async def on_unmount(self) -> None:
        await self.shutdown()


def run_app(
    settings: Settings,
    session: SessionFile | str | None = None,
    backend_factory: BackendFactory | None = None,
) -> int:
    """Run the chat app; returns the exit code. ``session``: one loaded already (``--continue``), or a
    name (``--session``). A session file that exists but does not load is an error here (exit 2 from the
    CLI), so a corrupt file is never overwritten by autosave."""
    initial: SessionFile | str | None = session
    if isinstance(session, str):
        path = session_path(settings.sessions_dir, session)
        if path.exists():
            initial = load_session(path)  # raises SessionError: one line, exit 2
    app = RadixChatApp(settings, session=initial, backend_factory=backend_factory)
    app.run()
    return app.return_code or 0


__all__ = ["RadixChatApp", "run_app"]
