"""Small modal dialogs: ask for a name, confirm an action."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from radixchat.tui.widgets.ordered_keys import OrderedInput


class NameDialog(ModalScreen[str | None]):
    """Returns the entered name (stripped, non-empty) or None when cancelled."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="dialog.cancel")]

    def __init__(self, title: str, initial: str = "", placeholder: str = "name") -> None:
        super().__init__()
        self.title_text, self.initial, self.placeholder = title, initial, placeholder

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.title_text, classes="dialog-title", markup=False)
            yield OrderedInput(self.initial, placeholder=self.placeholder, id="name")
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._ok(event.value)  # as it was at Enter: keys typed after it may have reached the box since

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._ok(self.query_one(Input).value)
        else:
            self.dismiss(None)

    def _ok(self, value: str) -> None:
        name = value.strip()
        if name:
            self.dismiss(name)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmDialog(ModalScreen[bool]):
    CSS_PATH = "dialogs.tcss"
    BINDINGS = [
        Binding("escape,n", "answer(False)", "No", id="dialog.no"),
        Binding("y", "answer(True)", "Yes", id="dialog.yes"),
    ]

    def __init__(self, question: str, yes: str = "Yes") -> None:
        super().__init__()
        self.question, self.yes = question, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="dialog-title", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes")
                yield Button("Cancel", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
