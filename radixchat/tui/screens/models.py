"""The model picker (F7, or "Switch model…" in the palette): the models the chat can move to.

The list (``chat/model_catalog.py``: recent models, bundled ones, those in ``models_dir``; with
``--backend URL`` the server's) is read in a thread when the picker opens. Typing filters it; Enter
takes the highlighted model, or what was typed when it is the path of a file or folder (a model that is
not listed). The current model is marked; a recent model that is gone is marked missing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Input, Static

from radixchat.chat.model_catalog import ModelEntry, model_key
from radixchat.tui.widgets.format import human_bytes

KIND_LABELS = {"bundled": "bundled", "gguf": "GGUF", "folder": "HF folder", "hub": "hub", "server": "server"}


def source_label(e: ModelEntry) -> str:
    kind = KIND_LABELS[e.kind]
    return f"recent · {kind}" if e.recent else kind


class ModelsScreen(ModalScreen[str | None]):
    """Dismisses with the ``model`` setting of the model to switch to, or None."""

    CSS_PATH = "models.tcss"
    BINDINGS = [
        Binding("enter", "choose", "Switch", id="models.choose", priority=True),
        Binding("down", "results", "To the list", id="models.results", show=False),
        Binding("escape", "close", "Close", id="models.close"),
    ]

    def __init__(self, catalog: Callable[[], Awaitable[list[ModelEntry]]], current: str, where: str) -> None:
        """``catalog`` lists the models (awaited once, on mount); ``current`` is the running model's
        ``model`` setting; ``where`` says where they were looked for (the title shows it)."""
        super().__init__()
        self.catalog = catalog
        self.current = model_key(current)
        self.where = where
        self.entries: list[ModelEntry] = []
        self.shown: list[ModelEntry] = []
        self.loaded = False

    def compose(self) -> ComposeResult:
        with Vertical(id="models"):
            yield Static(f"Switch model  ·  {self.where}", id="models-title", markup=False)
            yield Input(
                placeholder="Filter, or type the path of a .gguf file or model folder", id="models-filter"
            )
            yield DataTable(cursor_type="row", zebra_stripes=True, id="models-table")
            yield Static("", id="models-detail", markup=False)
            yield Footer()

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        self.reload()

    @work(exclusive=True, group="models-list")
    async def reload(self) -> None:
        try:
            self.entries = await self.catalog()
        except Exception as exc:  # a server that cannot list its models: say why, keep the picker
            self.query_one("#models-detail", Static).update(f"cannot list the models: {exc}")
            self.entries = []
        self.loaded = True
        self._fill()

    def on_input_changed(self, event: Input.Changed) -> None:
        if self.loaded:
            self._fill()

    @property
    def typed(self) -> str:
        return self.query_one(Input).value.strip()

    def _fill(self) -> None:
        text = self.typed.lower()
        self.shown = [e for e in self.entries if text in e.name.lower() or text in e.spec.lower()]
        table = self.query_one(DataTable)
        table.clear(columns=True)
        table.add_columns("model", "source", "size", "")
        for e in self.shown:
            mark = "● current" if model_key(e.spec) == self.current else ("missing" if e.missing else "")
            table.add_row(e.name, source_label(e), human_bytes(e.size) if e.size else "", mark)
        self._show_detail()

    def selected(self) -> ModelEntry | None:
        table = self.query_one(DataTable)
        if not self.shown or table.cursor_row is None or table.cursor_row >= len(self.shown):
            return None
        return self.shown[table.cursor_row]

    def on_data_table_row_highlighted(self) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        e = self.selected()
        if e is not None:
            text = e.spec
        elif not self.entries:
            text = "No models found. Type the path of a .gguf file or a model folder."
        else:
            text = "No model matches; Enter takes what you typed if it is a path."
        self.query_one("#models-detail", Static).update(text)

    def on_data_table_row_selected(self) -> None:
        self.action_choose()

    def action_results(self) -> None:
        self.query_one(DataTable).focus()

    def action_choose(self) -> None:
        typed = self.typed
        if typed and Path(typed).expanduser().exists():
            self.dismiss(typed)
            return
        e = self.selected()
        if e is None:
            self.notify(f"no model matches '{typed}', and it is not a file or folder", severity="warning")
        elif e.missing:
            self.notify(f"{e.spec} is gone (moved or deleted)", title=e.name, severity="error")
        else:
            self.dismiss(e.spec)

    def action_close(self) -> None:
        self.dismiss(None)
