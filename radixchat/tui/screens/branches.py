"""Switch between the branches of the conversation (edits and regenerations keep the old branch)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from radixchat.tui.state import Branch


def describe(i: int, branch: Branch, active: bool) -> str:
    msgs = [m for m in branch.conv.messages if m.role != "system"]
    last = msgs[-1] if msgs else None
    snippet = " ".join((last.content if last else "").split())
    snippet = snippet if len(snippet) <= 56 else snippet[:55] + "…"
    who = {"user": "you", "assistant": "reply"}.get(last.role, last.role) if last else ""
    mark = "●" if active else " "
    return f"{mark} {i + 1}. {branch.label} · {len(msgs)} messages · {who}: “{snippet}”"


class BranchesScreen(ModalScreen[int | None]):
    CSS_PATH = "branches.tcss"
    BINDINGS = [Binding("escape", "dismiss_none", "Close", id="branches.close")]

    def __init__(self, branches: list[Branch], active: int) -> None:
        super().__init__()
        self.branches, self.active = branches, active

    def compose(self) -> ComposeResult:
        with Vertical(id="branches"):
            yield Static("Branches — Enter switches; all share the cached prefix", id="branches-title")
            yield OptionList(
                *(Option(describe(i, b, i == self.active), id=str(i)) for i, b in enumerate(self.branches))
            )

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.highlighted = self.active
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id or 0))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
