"""The app's session actions: autosave, save, open, export, new chat, per-session settings.

A mixin of ``RadixChatApp`` (kept apart so the app module stays readable). Files are written through
``radixchat.chat.session`` (atomic), in a thread so a slow disk never stalls the window.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work

from radixchat.chat.session import SessionFile, load_session, save_session, session_path
from radixchat.errors import SessionError
from radixchat.tui.backend import warm
from radixchat.tui.screens.dialogs import ConfirmDialog, NameDialog
from radixchat.tui.screens.sessions import SessionsScreen
from radixchat.tui.screens.settings import FIELDS, SettingsScreen
from radixchat.tui.session_store import export_markdown, markdown_path
from radixchat.tui.state import Branch, auto_session_name, display_messages, rerendered
from radixchat.tui.widgets.note import Note
from radixchat.tui.widgets.prompt import PromptHistory

if TYPE_CHECKING:
    from radixchat.tui.app import RadixChatApp

    _Base = RadixChatApp
else:
    _Base = object


class SessionActions(_Base):
    autosave_enabled = True

    @property
    def sessions_dir(self) -> Path:
        return Path(self.settings.sessions_dir)

    def _has_turns(self) -> bool:
        conv = self.state.conv
        return conv is not None and any(m.role == "assistant" for m in conv.messages)

    async def write_session(self, name: str, replaces: Path | None = None) -> Path | None:
        """Save the active branch as ``name`` (then remove ``replaces``); notify and return None on failure.

        Writes are serialized: an autosave still in flight must not land after a rename removed its file.
        """
        lock = getattr(self, "_save_lock", None)
        if lock is None:
            lock = self._save_lock = asyncio.Lock()
        async with lock:
            try:
                session = self.state.to_session(name)
                path = await asyncio.to_thread(save_session, session, session_path(self.sessions_dir, name))
                if replaces is not None and replaces.resolve() != path.resolve():
                    replaces.unlink(missing_ok=True)
            except (OSError, ValueError) as exc:
                self.notify(f"cannot save session '{name}': {exc}", title="Save failed", severity="error")
                return None
        self.state.base = session
        return path

    async def autosave(self) -> None:
        """After each completed turn: save under the session's name (made up the first time)."""
        if not self.autosave_enabled or not self._has_turns():
            return
        s = self.state
        if s.session_name is None:
            s.session_name, s.auto_named = auto_session_name(), True
        await self.write_session(s.session_name)
        self.update_status()

    @work(group="session-save", exclusive=True)
    async def action_save(self, ask: bool = False) -> None:
        s = self.state
        if s.conv is None:
            return
        name = s.session_name
        if ask or name is None or s.auto_named:
            chosen = await self.push_screen_wait(NameDialog("Save session as", name or auto_session_name()))
            if not chosen:
                return
            exists = chosen != name and session_path(self.sessions_dir, chosen).exists()
            question = f"Replace the saved session '{chosen}'?"
            if exists and not await self.push_screen_wait(ConfirmDialog(question, "Replace")):
                return
            old = session_path(self.sessions_dir, name) if name and s.auto_named and chosen != name else None
            name = chosen
        else:
            old = None
        path = await self.write_session(name, replaces=old)  # a made-up name is renamed, not copied
        if path is None:
            return
        s.session_name, s.auto_named = name, False
        self.update_status()
        self.notify(f"Saved to {path}", title="Session saved", timeout=3)

    def action_save_as(self) -> None:
        self.action_save(ask=True)

    def action_sessions(self) -> None:
        def renamed(old: str, new: str) -> None:
            if self.state.session_name == old:
                self.state.session_name, self.state.auto_named = new, False
                self.update_status()

        def deleted(name: str) -> None:
            if self.state.session_name == name:  # the chat stays open, unsaved
                self.state.session_name, self.state.base = None, None
                self.update_status()

        async def chosen(path: Path | None) -> None:
            if path is None:
                return
            try:
                session = await asyncio.to_thread(load_session, path)
            except SessionError as exc:
                self.notify(str(exc), title="Cannot open", severity="error")
                return
            await self.open_session(session)

        screen = SessionsScreen(self.sessions_dir, self.state.session_name, renamed, deleted)
        self.push_screen(screen, chosen)

    async def open_session(self, session: SessionFile) -> None:
        """Show ``session``; once the backend is ready, continue it and warm the cache with its history."""
        await self.stop_reply()
        s = self.state
        s.adopt(session)
        backend = self.backend
        if backend is None:
            self._pending = session
            await self.transcript.show(display_messages(session), self.welcome())
        else:
            self.check_session_tools()
            s.restore(session, backend.fmt, backend.model_name, self.session_tool_declarations(session))
            conv = s.conv
            await self.transcript.show(conv.messages, self.welcome())
            if session.model != backend.model_name:
                note = (
                    f"This session was saved with {session.model}; it continues with {backend.model_name}. "
                    "Its history is re-tokenized for this model, and the next save records the new model."
                )
                await self.transcript.add(Note(note, "info"))
            warmed = warm(backend, conv)
            if warmed:
                self.notify(
                    f"Prefilling {warmed} tokens of history in the background", title=session.name, timeout=3
                )
        self.prompt.prompts = PromptHistory([m.content for m in session.messages if m.role == "user"])
        await self.probe_mode()
        self.update_status()
        self.refresh_panels()

    def session_tool_declarations(self, session: SessionFile) -> list[dict] | None:
        """The declarations a saved conversation was rendered with: the offered tools, when it used tool
        mode (without them its token ids would not match its rendering, and the next turn would be a
        full re-render instead of a delta)."""
        used = session.mode == "tool" or any(m.role == "tool" or m.tool_calls for m in session.messages)
        return self.tool_declarations() if used else None

    async def action_new_chat(self) -> None:
        await self.stop_reply()
        s = self.state
        s.new_session()
        if self.backend is not None:
            s.reset(self.backend.new_conversation(system=s.system_prompt))
        await self.transcript.show(s.conv.messages if s.conv else [], self.welcome())
        self.prompt.clear()
        self.update_status()
        self.refresh_panels()

    async def action_export_markdown(self) -> None:
        s = self.state
        if not self._has_turns():
            self.notify("Nothing to export yet", severity="warning")
            return
        name = s.session_name or auto_session_name()
        try:
            path = await asyncio.to_thread(
                export_markdown, s.to_session(name), markdown_path(self.sessions_dir, name)
            )
        except OSError as exc:
            self.notify(str(exc), title="Export failed", severity="error")
            return
        self.notify(f"Exported to {path}", title="Markdown")

    def action_settings(self) -> None:
        defaults = {name: getattr(self.settings, name) for name in FIELDS}

        async def done(result: Any) -> None:
            if result is not None:
                await self.apply_settings(*result)

        self.push_screen(SettingsScreen(self.state.system_prompt, self.state.sampling, defaults), done)

    async def apply_settings(self, system: str | None, sampling: Any) -> None:
        s = self.state
        s.sampling = sampling
        if system != s.system_prompt:
            s.system_prompt = system
            conv = s.conv
            if self.backend is not None and conv is not None:
                await self.stop_reply()
                if any(m.role != "system" for m in conv.messages):
                    s.fork(rerendered(conv, self.backend.fmt, system), "new system prompt")
                else:
                    s.branches[s.active] = Branch(
                        self.backend.new_conversation(system=system), s.branches[s.active].label
                    )
                await self.transcript.show(s.conv.messages, self.welcome())
        self.update_status()
        self.notify("Session settings applied", timeout=2)
        if s.session_name and self._has_turns():
            await self.write_session(s.session_name)
