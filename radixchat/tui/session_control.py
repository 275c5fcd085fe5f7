"""The chat screen's session actions: save (as), open, new chat, export, and the per-session settings
(system prompt and sampling on F2, the offered tools and tool_choice on F4 in tool mode).

``SessionControl`` changes what the screen's ``ChatCore`` holds (the session state, the pending session)
and shows it through a ``SessionHost`` (the chat screen), using only the members the protocol names
(``tui/host.py``), so this module does not import the screen. Files are written by the core's
``SessionKeeper`` (atomic, one at a time, in a thread); a failed save is said in a notification, never
lost silently.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from radixchat.chat.model_catalog import local_catalog
from radixchat.chat.session import SamplingSettings, SessionFile, load_session, session_path
from radixchat.errors import SessionError
from radixchat.tui.backend import warm
from radixchat.tui.host import ChatHost
from radixchat.tui.messages import SwitchModelRequested
from radixchat.tui.state import Branch, auto_session_name, display_messages, rerendered
from radixchat.tui.tools import choice_label, command_of, unknown_tools_problem
from radixchat.tui.widgets.note import Note
from radixchat.tui.widgets.prompt import PromptHistory

# The dialogs and screens below are imported where they open: the first frame needs none of them, and
# loading them up front slows the start-up (tests/test_layering.py keeps it so).
if TYPE_CHECKING:
    from textual.message import Message as TextualMessage

    from radixchat.chat.modes import Mode
    from radixchat.tui.chat_core import ChatCore
    from radixchat.tui.screens.tools import ToolSetup
    from radixchat.tui.widgets.welcome import Welcome


class SessionHost(ChatHost, Protocol):
    """What the session actions use of the chat screen."""

    def welcome(self) -> Welcome: ...
    def refresh_panels(self) -> None: ...
    async def action_set_mode(self, mode: Mode) -> None: ...
    async def stop_reply(self) -> None: ...
    def post_message(self, message: TextualMessage) -> bool: ...


class SessionControl:
    def __init__(self, core: ChatCore, host: SessionHost) -> None:
        self.core = core
        self.keeper = core.keeper
        self.host = host

    @property
    def folder(self) -> Path:
        return self.keeper.folder

    async def write(self, name: str, replaces: Path | None = None) -> Path | None:
        """Save the open session as ``name`` (then remove ``replaces``); on failure notify and return None."""
        before = self.keeper.kv_notice
        try:
            path = await self.keeper.write(name, replaces)
        except (OSError, ValueError) as exc:
            self.host.notify(f"cannot save session '{name}': {exc}", title="Save failed", severity="error")
            return None
        self.kv_notice(before)
        return path

    async def autosave(self) -> None:
        """After each completed turn: save under the session's name (made up the first time)."""
        before = self.keeper.kv_notice
        try:
            saved = await self.keeper.autosave()
        except (OSError, ValueError) as exc:
            name = self.core.state.session_name
            self.host.notify(f"cannot save session '{name}': {exc}", title="Save failed", severity="error")
            saved = True
        if saved:
            self.kv_notice(before)
            self.host.update_status()

    def kv_notice(self, before: str | None) -> None:
        """Say (once, as a warning) that the last save stored the session but not all its KV."""
        notice = self.keeper.kv_notice
        if notice and notice != before:
            self.host.notify(notice, title="KV store", severity="warning", timeout=4)

    async def save(self, ask: bool = False) -> None:
        """Save, asking for a name the first time (or with ``ask``); a made-up name is renamed, not copied.
        Runs in a worker (it waits for dialogs)."""
        host, s = self.host, self.core.state
        if s.conv is None:
            return
        name = s.session_name
        old = None
        if ask or name is None or s.auto_named:
            from radixchat.tui.screens.dialogs import ConfirmDialog, NameDialog

            app = host.app
            chosen = await app.push_screen_wait(NameDialog("Save session as", name or auto_session_name()))
            if not chosen:
                return
            exists = chosen != name and session_path(self.folder, chosen).exists()
            question = f"Replace the saved session '{chosen}'?"
            if exists and not await app.push_screen_wait(ConfirmDialog(question, "Replace")):
                return
            old = session_path(self.folder, name) if name and s.auto_named and chosen != name else None
            name = chosen
        path = await self.write(name, replaces=old)
        if path is None:
            return
        s.session_name, s.auto_named = name, False
        host.update_status()
        host.notify(f"Saved to {path}", title="Session saved", timeout=3)

    def browse(self) -> None:
        """The session browser; the session chosen there is opened."""
        host, core, s = self.host, self.core, self.core.state

        def renamed(old: str, new: str) -> None:
            if s.session_name == old:
                s.session_name, s.auto_named = new, False
                host.update_status()

        def deleted(name: str) -> None:
            if s.session_name == name:  # the chat stays open, unsaved
                s.session_name, s.base = None, None
                host.update_status()

        async def chosen(path: Path | None) -> None:
            if path is None:
                return
            try:
                session = await asyncio.to_thread(load_session, path)
            except SessionError as exc:
                host.notify(str(exc), title="Cannot open", severity="error")
                return
            await self.open(session)

        from radixchat.tui.screens.sessions import SessionsScreen

        screen = SessionsScreen(self.folder, s.session_name, renamed, deleted, backend=core.backend)
        host.app.push_screen(screen, chosen)

    async def open(self, session: SessionFile) -> None:
        """Show ``session``; once the backend is ready, continue it and warm the cache with its history."""
        host, core, s = self.host, self.core, self.core.state
        await host.stop_reply()
        s.adopt(session)
        backend = core.backend
        if backend is None:
            core.pending_session = session
            await host.transcript.show(display_messages(session), host.welcome())
        else:
            self.check_tools()
            s.restore(session, backend.fmt, backend.model_name, self.tool_declarations(session))
            conv = s.conv
            await host.transcript.show(conv.messages, host.welcome())
            if session.model != backend.model_name:
                note = (
                    f"This session was saved with {session.model}; it continues with {backend.model_name}. "
                    "Its history is re-tokenized for this model, and the next save records the new model "
                    "(F7 switches models)."
                )
                await host.transcript.add(Note(note, "info"))
        host.prompt.prompts = PromptHistory([m.content for m in session.messages if m.role == "user"])
        await core.probe_mode()
        host.update_status()
        if backend is not None and s.conv is not None:
            # After the window shows the session: the stored KV is read off the event loop meanwhile.
            warmed = await warm(backend, s.conv)
            for notice in warmed.loaded.notices:
                host.notify(notice, title="KV store", severity="warning")
            if warmed.tokens:
                host.notify(warmed.summary(), title=session.name, timeout=3)
        host.refresh_panels()
        if backend is not None and session.model != backend.model_name:
            await self.offer_model(session.model)

    async def offer_model(self, name: str) -> None:
        """A session saved with another model: if the model picker knows a model of that name (recent,
        bundled, in ``models_dir``), ask whether to switch to it."""
        host, core = self.host, self.core
        if core.backend is None or core.backend.base_url is not None:
            return  # a server's models are its own; F7 lists them
        s = core.settings
        entries = await asyncio.to_thread(local_catalog, s.models_dir, s.cache_dir)
        entry = next((e for e in entries if e.name == name and not e.missing), None)
        if entry is None:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                host.post_message(SwitchModelRequested(entry.spec))

        from radixchat.tui.screens.dialogs import ConfirmDialog

        question = f"This session was saved with {name}. Switch to it?"
        host.app.push_screen(ConfirmDialog(question, f"Switch to {name}"), answered)

    def check_tools(self) -> None:
        """After opening a session: drop the tools it names that the config file no longer declares."""
        s = self.core.state
        names = s.tool_names
        if names is None:
            return
        missing = [n for n in names if not self.core.tool_known(n)]
        if missing:
            s.tool_names = [n for n in names if self.core.tool_known(n)] or None
            self.host.notify(
                f"This session offered {', '.join(missing)}, which the config file does not declare now.",
                title="Tools",
                severity="warning",
            )

    def tool_declarations(self, session: SessionFile) -> list[dict] | None:
        """The declarations a saved conversation was rendered with: the offered tools, when it used tool
        mode (without them its token ids would not match its rendering, and the next turn would be a
        full re-render instead of a delta)."""
        used = session.mode == "tool" or any(m.role == "tool" or m.tool_calls for m in session.messages)
        return self.core.tool_declarations() if used else None

    async def new_chat(self) -> None:
        host, core, s = self.host, self.core, self.core.state
        await host.stop_reply()
        s.new_session()
        if core.backend is not None:
            s.reset(core.backend.new_conversation(system=s.system_prompt))
        await host.transcript.show(s.conv.messages if s.conv else [], host.welcome())
        host.prompt.clear()
        host.update_status()
        host.refresh_panels()

    async def export_markdown(self) -> None:
        host = self.host
        if not self.keeper.has_turns():
            host.notify("Nothing to export yet", severity="warning")
            return
        try:
            path = await self.keeper.export_markdown()
        except OSError as exc:
            host.notify(str(exc), title="Export failed", severity="error")
            return
        host.notify(f"Exported to {path}", title="Markdown")

    def edit_settings(self) -> None:
        from radixchat.tui.screens.settings import FIELDS, SettingsScreen

        host, s = self.host, self.core.state
        defaults = {name: getattr(self.core.settings, name) for name in (*FIELDS, "stop")}

        async def done(result: Any) -> None:
            if result is None:
                return
            system, sampling, preset = result
            if preset is None:
                await self.apply_settings(system, sampling)
            else:  # the fields as the preset filled them in, and as they were edited after
                await self.apply_preset(preset, (system, sampling))

        presets = self.core.settings.presets
        host.app.push_screen(SettingsScreen(s.system_prompt, s.sampling, defaults, presets), done)

    async def apply_preset(
        self, name: str, edited: tuple[str | None, SamplingSettings] | None = None
    ) -> None:
        """A ``[presets.NAME]`` of the config file as the session's settings: its sampling (fields it
        leaves out: the defaults), its system prompt, tools and tool_choice if it sets them, then its mode.
        ``edited``: the system prompt and sampling from F2, where the preset filled them in."""
        host, s = self.host, self.core.state
        preset = self.core.settings.presets.get(name)
        if preset is None:
            return
        if preset.tools is not None:
            s.tool_names = list(preset.tools)
            if problem := unknown_tools_problem(self.core.tool_known, name, preset.tools):
                host.notify(problem, title="Preset", severity="warning")
        if preset.tool_choice is not None:
            s.tool_choice = preset.tool_choice
        if edited is not None:
            system, sampling = edited
        else:
            sampling = SamplingSettings(**{n: getattr(preset, n) for n in SamplingSettings.model_fields})
            system = preset.system_prompt if preset.system_prompt is not None else s.system_prompt
        await self.apply_settings(system, sampling, notice=f"Preset '{name}' applied")
        if preset.mode is not None and preset.mode != s.mode:
            await host.action_set_mode(preset.mode)

    async def apply_settings(
        self, system: str | None, sampling: SamplingSettings, notice: str = "Session settings applied"
    ) -> None:
        host, core, s = self.host, self.core, self.core.state
        s.sampling = sampling
        if system != s.system_prompt:
            s.system_prompt = system
            conv, backend = s.conv, core.backend
            if backend is not None and conv is not None:
                await host.stop_reply()
                if any(m.role != "system" for m in conv.messages):
                    s.fork(rerendered(conv, backend.fmt, system), "new system prompt")
                else:
                    s.branches[s.active] = Branch(
                        backend.new_conversation(system=system), s.branches[s.active].label
                    )
                await host.transcript.show(s.conv.messages, host.welcome())
        host.update_status()
        host.notify(notice, timeout=2)
        if s.session_name and self.keeper.has_turns():
            await self.write(s.session_name)

    def edit_tools(self) -> None:
        """Tool mode's screen: the tools offered and tool_choice (saved with the session)."""
        from radixchat.tui.screens.tools import ToolsScreen

        host, core, s = self.host, self.core, self.core.state

        async def done(setup: ToolSetup | None) -> None:
            if setup is None:
                return
            s.tool_names, s.tool_choice = setup.names, setup.choice
            host.notify(
                f"{len(setup.names)} tools offered · tool_choice {choice_label(setup.choice)}",
                title="Tool mode",
            )
            await host.action_set_mode("tool")
            if s.session_name and self.keeper.has_turns():
                await self.write(s.session_name)

        tools = list(core.registry.tools.values())
        commands = {t.name: command_of(core.settings, t.name) or [] for t in tools if not t.builtin}
        problem = core.mode_problem if s.mode == "tool" else None
        offered = [t.name for t in core.offered_tools()]
        host.app.push_screen(ToolsScreen(tools, offered, s.tool_choice, problem, commands), done)
