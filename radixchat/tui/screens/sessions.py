"""The session browser: open, rename, delete, export saved sessions, and search the text of all of them.

The search box filters the list to the sessions whose messages (any branch) or name contain what is typed,
case-insensitively, and shows where each matches. The sessions are read once, in a thread, when the
browser opens; each search runs in a thread too, so a large folder never stalls typing.

With a backend that has a KV store, a column shows which sessions are warm (their KV is on disk, so
they reopen without a prefill) and how much disk that takes; deleting a session deletes its KV, renaming
it moves its KV along.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static

from radixchat.chat.backend import ChatBackend, StoredKV, kv_owner
from radixchat.chat.session import load_session
from radixchat.errors import SessionError
from radixchat.tui.screens.dialogs import ConfirmDialog, NameDialog
from radixchat.tui.session_store import (
    SessionEntry,
    delete_session,
    export_markdown,
    list_sessions,
    markdown_path,
    rename_session,
    search_sessions,
)
from radixchat.tui.widgets.format import human_bytes


class SessionsScreen(ModalScreen[Path | None]):
    """Dismisses with the path of the session to open, or None."""

    CSS_PATH = "sessions.tcss"
    BINDINGS = [
        Binding("enter", "open", "Open", id="sessions.open", priority=True),
        Binding("r", "rename", "Rename", id="sessions.rename"),
        Binding("d,delete", "delete", "Delete", id="sessions.delete"),
        Binding("x", "export", "Export .md", id="sessions.export"),
        Binding("slash", "search", "Search", id="sessions.search"),
        Binding("down", "results", "To the list", id="sessions.results", show=False),
        Binding("escape", "close", "Close", id="sessions.close"),
    ]

    def __init__(
        self,
        sessions_dir: Path,
        current: str | None = None,
        on_renamed: Callable[[str, str], None] | None = None,
        on_deleted: Callable[[str], None] | None = None,
        backend: ChatBackend | None = None,
    ) -> None:
        super().__init__()
        self.sessions_dir = Path(sessions_dir)
        self.current = current
        self.on_renamed = on_renamed
        self.on_deleted = on_deleted
        # The KV store's backend (None: still loading, or no store): the warm column, KV delete/rename.
        self.kv = backend if backend is not None and backend.has_kv_store else None
        self.entries: list[SessionEntry] = []  # every session in the folder, newest first
        self.shown: list[SessionEntry] = []  # the table's rows: those the search finds (all, with none)
        self.snippets: dict[Path, str] = {}  # where each shown session matches the search
        self.search_text = ""
        self.stored: dict[str, StoredKV] = {}  # by owner (``kv_owner`` of a session file)

    def compose(self) -> ComposeResult:
        with Vertical(id="sessions"):
            yield Static(f"Saved sessions  ·  {self.sessions_dir}/", id="sessions-title", markup=False)
            yield Input(placeholder="Search the text of every session (/)", id="sessions-search")
            yield DataTable(cursor_type="row", zebra_stripes=True, id="sessions-table")
            yield Static("", id="sessions-detail", markup=False)
            yield Footer()

    def on_mount(self) -> None:
        self.reload()

    def kv_label(self, e: SessionEntry) -> str:
        """``warm · 12.3 MiB`` when the session's KV is stored (it reopens without a prefill)."""
        stored = self.stored.get(kv_owner(e.path))
        if stored is None or not stored.tokens:
            return ""
        return f"warm · {human_bytes(stored.bytes)}"

    @work(exclusive=True, group="sessions-list")
    async def reload(self, select: str | None = None) -> None:
        self.entries = await asyncio.to_thread(list_sessions, self.sessions_dir)
        if self.kv is not None:
            self.stored = await asyncio.to_thread(self.kv.kv_usage)
        await self._search(select)
        self.query_one(DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.search_text = event.value.strip()
        self.search()

    @work(exclusive=True, group="sessions-search")
    async def search(self) -> None:
        await self._search()

    async def _search(self, select: str | None = None) -> None:
        query = self.search_text
        if query:
            found = await asyncio.to_thread(search_sessions, self.entries, query)
            self.shown, self.snippets = [e for e, _ in found], {e.path: hit for e, hit in found}
        else:
            self.shown, self.snippets = list(self.entries), {}
        self._fill(select)

    def _fill(self, select: str | None) -> None:
        """The table: the shown sessions; while searching, where each matches instead of model and turns."""
        table = self.query_one(DataTable)
        table.clear(columns=True)
        if self.search_text:
            table.add_columns("name", "match", "last modified")
        else:
            table.add_columns("name", "model", "turns", "last modified", *(["KV on disk"] if self.kv else []))
        for e in self.shown:
            name = f"{e.name} ●" if e.name == self.current else e.name
            when = e.modified.astimezone().strftime("%Y-%m-%d %H:%M") if e.modified else ""
            if self.search_text:
                table.add_row(name, self.snippets.get(e.path, ""), when, key=str(e.path))
                continue
            model = "⚠ unreadable" if e.error else e.model
            row = [name, model, str(e.turns) if not e.error else "", when]
            table.add_row(*row, *([self.kv_label(e)] if self.kv else []), key=str(e.path))
        names = [e.name for e in self.shown]
        if select in names:
            table.move_cursor(row=names.index(select))
        self._show_detail()
        detail = self.query_one("#sessions-detail", Static)
        if not self.entries:
            detail.update("No saved sessions yet (Ctrl+S saves the chat).")
        elif not self.shown:
            detail.update(f"No saved session contains '{self.search_text}'.")

    def action_search(self) -> None:
        self.query_one("#sessions-search", Input).focus()

    def action_results(self) -> None:
        self.query_one(DataTable).focus()

    def selected(self) -> SessionEntry | None:
        table = self.query_one(DataTable)
        if not self.shown or table.cursor_row is None or table.cursor_row >= len(self.shown):
            return None
        return self.shown[table.cursor_row]

    def on_data_table_row_highlighted(self) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        e = self.selected()
        self.query_one("#sessions-detail", Static).update(e.error or str(e.path) if e else "")

    def on_data_table_row_selected(self) -> None:
        self.action_open()

    def action_open(self) -> None:
        e = self.selected()
        if e is None:
            return
        if e.error:
            self.notify(e.error, severity="error", title="Cannot open")
            return
        self.dismiss(e.path)

    def action_close(self) -> None:
        self.dismiss(None)

    @staticmethod
    def _what(e: SessionEntry) -> str:
        return f"the unreadable file {e.path.name}" if e.error else f"session '{e.name}'"

    @work(group="sessions-edit")
    async def action_rename(self) -> None:
        e = self.selected()
        if e is None:
            return
        new = await self.app.push_screen_wait(NameDialog(f"Rename {self._what(e)} to", e.name))
        if not new or new == e.name:
            return
        try:
            path = await asyncio.to_thread(rename_session, self.sessions_dir, e, new)
        except (SessionError, OSError) as exc:
            self.notify(str(exc), severity="error", title="Rename failed")
            return
        if self.kv is not None and path.resolve() != e.path.resolve():
            await asyncio.to_thread(self.kv.rename_kv, kv_owner(e.path), kv_owner(path))
        if e.error:  # only the file moved (as it is): the chat open in the app is not this one
            self.reload(select=path.stem)
            return
        if self.on_renamed is not None:
            self.on_renamed(e.name, new)
        if self.current == e.name:
            self.current = new
        self.reload(select=new)

    @work(group="sessions-edit")
    async def action_delete(self) -> None:
        e = self.selected()
        if e is None:
            return
        if not await self.app.push_screen_wait(
            ConfirmDialog(f"Delete {self._what(e)}? This cannot be undone.", "Delete")
        ):
            return
        try:
            delete_session(e)
        except OSError as exc:
            self.notify(str(exc), severity="error", title="Delete failed")
            return
        if self.kv is not None:
            await asyncio.to_thread(self.kv.delete_kv, kv_owner(e.path))
        if self.on_deleted is not None:
            self.on_deleted(e.name)
        self.reload()

    @work(group="sessions-edit")
    async def action_export(self) -> None:
        e = self.selected()
        if e is None:
            return
        if e.error:
            self.notify(
                f"{e.path.name} does not load, so there is nothing to export: {e.error}",
                severity="error",
                title="Cannot export",
            )
            return
        try:
            session = await asyncio.to_thread(load_session, e.path)
            path = await asyncio.to_thread(export_markdown, session, markdown_path(self.sessions_dir, e.name))
        except (SessionError, OSError) as exc:
            self.notify(str(exc), severity="error", title="Export failed")
            return
        self.notify(f"Exported to {path}", title="Markdown")
