"""F1: every key binding (as currently mapped), with the ids to remap them in config.toml's ``[keymap]``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown, Static

INTRO = """\
**Enter** sends the prompt; **Ctrl+J** inserts a newline (Shift+Enter and Alt+Enter too, where the
terminal reports them). **Shift+Tab** from the prompt selects the last message, **↑/↓** walk the
messages. Select text with the mouse to copy it. Remap any key by its id in the `[keymap]` table of
`~/.config/radixchat/config.toml`, e.g. `"mode.cycle" = "f5"`.
"""


class HelpScreen(ModalScreen[None]):
    CSS_PATH = "help.tcss"
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close", id="help.close")]

    def __init__(
        self, groups: Sequence[tuple[str, Sequence[BindingType]]], keymap: Mapping[str, str] | None = None
    ) -> None:
        super().__init__()
        self.groups = groups
        self.keymap = keymap or {}  # the app's (binding id -> keys)

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static("radixchat — keys", id="help-title")
            with VerticalScroll():
                yield Markdown(INTRO)
                yield Static(self.table(), id="help-table")
            yield Static("Esc closes", id="help-hint")

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(group, keys as shown, what it does, binding id), with the keymap applied."""
        keymap = self.keymap
        out = []
        for title, bindings in self.groups:
            for b in bindings:
                if not isinstance(b, Binding) or not b.description:
                    continue
                keys = keymap.get(b.id, b.key) if b.id else b.key
                shown = ", ".join(self.app.get_key_display(Binding(k.strip(), "")) for k in keys.split(","))
                out.append((title, shown, b.description, b.id or ""))
        return out

    def table(self) -> Table:
        theme = self.app.current_theme
        table = Table(box=None, expand=True, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
        table.add_column("key", style=f"bold {theme.accent}", no_wrap=True, min_width=14)
        table.add_column("does", ratio=1)
        table.add_column("id", style="dim", no_wrap=True)
        group = None
        for title, keys, description, binding_id in self.rows():
            if title != group:
                if group is not None:
                    table.add_row("", "", "")
                table.add_row(Text(title, style=f"bold {theme.primary}"), "", "")
                group = title
            table.add_row(keys, description, binding_id)
        return table
