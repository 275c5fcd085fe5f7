"""Every key binding of the app by group (F1 lists them), and a check of the config file's ``[keymap]``.

Each binding has an id; ``[keymap]`` in config.toml maps ids to keys (``"mode.cycle" = "f5"``, several keys
comma-separated), and Textual applies it to every screen and widget. The app's own bindings are declared
here too (``APP_BINDINGS``), so that this module needs no import of the app.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.binding import Binding, BindingType

# The app's bindings: Textual's own two, given ids so that F1 lists them and [keymap] can move them
# ("palette" is the word Textual's footer shows). The chat's are the chat screen's.
APP_BINDINGS: list[BindingType] = [
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


def binding_groups() -> list[tuple[str, Sequence[BindingType]]]:
    """(group title, bindings) for every screen and widget, in the order F1 shows them."""
    from radixchat.tui.chat_screen import ChatScreen
    from radixchat.tui.screens.attach import AttachScreen
    from radixchat.tui.screens.branches import BranchesScreen
    from radixchat.tui.screens.consent import ConsentScreen
    from radixchat.tui.screens.dialogs import ConfirmDialog, NameDialog
    from radixchat.tui.screens.help import HelpScreen
    from radixchat.tui.screens.models import ModelsScreen
    from radixchat.tui.screens.schema import SchemaScreen
    from radixchat.tui.screens.sessions import SessionsScreen
    from radixchat.tui.screens.settings import SettingsScreen
    from radixchat.tui.screens.tools import ToolsScreen
    from radixchat.tui.widgets.assistant_message import AssistantMessage
    from radixchat.tui.widgets.message_view import MessageView
    from radixchat.tui.widgets.prompt import PromptInput
    from radixchat.tui.widgets.user_message import UserMessage

    # Attaching's keys, the chat screen's and the prompt's, together: one feature, one group.
    attach = [b for b in [*ChatScreen.BINDINGS, *PromptInput.BINDINGS] if _id(b) in ATTACH_IDS]
    return [
        ("Chat", [*_without(ChatScreen.BINDINGS, ATTACH_IDS), *APP_BINDINGS]),
        ("Prompt", _without(PromptInput.BINDINGS, ATTACH_IDS)),
        ("Selected message", MessageView.BINDINGS + UserMessage.BINDINGS + AssistantMessage.BINDINGS),
        ("Session browser", SessionsScreen.BINDINGS),
        ("Tool consent", ConsentScreen.BINDINGS),
        ("Tools (F4 in tool mode)", ToolsScreen.BINDINGS),
        ("Schema (F4 in json mode)", SchemaScreen.BINDINGS),
        ("Session settings", SettingsScreen.BINDINGS),
        ("Branches", BranchesScreen.BINDINGS),
        ("Attach files", [*attach, *AttachScreen.BINDINGS]),
        ("Model picker (F7)", ModelsScreen.BINDINGS),
        ("Dialogs", NameDialog.BINDINGS + ConfirmDialog.BINDINGS),
        ("Help", HelpScreen.BINDINGS),
    ]


ATTACH_IDS = frozenset({"attach.pick", "prompt.complete"})


def _id(binding: BindingType) -> str | None:
    return binding.id if isinstance(binding, Binding) else None


def _without(bindings: Sequence[BindingType], ids: frozenset[str]) -> list[BindingType]:
    return [b for b in bindings if _id(b) not in ids]


def binding_ids() -> set[str]:
    return {
        b.id for _title, bindings in binding_groups() for b in bindings if isinstance(b, Binding) and b.id
    }


def check_keymap(keymap: dict[str, str]) -> str | None:
    """Why some of ``keymap`` has no effect (ids no binding has), or None."""
    unknown = sorted(set(keymap) - binding_ids())
    if not unknown:
        return None
    return f"[keymap] in the config file: no binding has the id {', '.join(repr(u) for u in unknown)} (F1 lists them)"
