"""The file picker (F8, or "Attach file…" in the palette): a folder tree from the working directory;
Enter on a file attaches it (``@path`` in the prompt), Esc closes."""

from __future__ import annotations

from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DirectoryTree, Static


class AttachScreen(ModalScreen[Path | None]):
    """Returns the chosen file, or None when cancelled."""

    CSS_PATH = "attach.tcss"
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="attach.cancel")]

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static("Attach a file (Enter attaches, Esc cancels)", classes="dialog-title")
            yield DirectoryTree(self.root, id="files")

    def on_mount(self) -> None:
        self.query_one(DirectoryTree).focus()

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        event.stop()
        self.dismiss(event.path)

    def action_cancel(self) -> None:
        self.dismiss(None)
