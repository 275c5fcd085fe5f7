"""Bindings: every one has an id, the keymap remaps them (tui.toml or injected), F1 lists them."""

from __future__ import annotations

from textual.binding import Binding

from radixchat.tui.app import RadixChatApp
from radixchat.tui.screens.branches import BranchesScreen
from radixchat.tui.screens.dialogs import ConfirmDialog, NameDialog
from radixchat.tui.screens.help import HelpScreen
from radixchat.tui.screens.schema import SchemaScreen
from radixchat.tui.screens.sessions import SessionsScreen
from radixchat.tui.screens.settings import SettingsScreen
from radixchat.tui.screens.tools import ToolsScreen
from radixchat.tui.tui_config import TuiConfig, load_tui_config
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.message_view import MessageView
from radixchat.tui.widgets.prompt import PromptInput
from radixchat.tui.widgets.user_message import UserMessage
from tests.tui.conftest import TERMINAL, ready

CLASSES = [
    RadixChatApp,
    PromptInput,
    MessageView,
    UserMessage,
    AssistantMessage,
    HelpScreen,
    SessionsScreen,
    SettingsScreen,
    SchemaScreen,
    ToolsScreen,
    BranchesScreen,
    NameDialog,
    ConfirmDialog,
]


def test_every_binding_has_a_unique_id():
    ids = []
    for cls in CLASSES:
        for b in cls.BINDINGS:
            assert isinstance(b, Binding) and b.id, f"{cls.__name__}: {b} has no id"
            ids.append(b.id)
    assert len(ids) == len(set(ids))


async def test_a_keymap_override_moves_a_binding(make_app):
    app = make_app(tui_config=TuiConfig(keymap={"mode.cycle": "f5"}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.state.mode == "chat"
        await pilot.press("f5")
        await pilot.pause()
        assert app.state.mode == "json"


async def test_the_prompt_send_key_can_be_remapped(make_app, fake):
    app = make_app(tui_config=TuiConfig(keymap={"prompt.send": "ctrl+s", "session.save": "f9"}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("a", "enter", "b")
        assert app.prompt.text == "a\nb"  # Enter is a plain newline now
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert fake.script.replies == ["a\nb"]


def test_tui_toml_is_read_from_the_config_dir(tui_env):
    cfg_dir = tui_env / "config" / "radixchat"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "tui.toml").write_text('theme = "nord"\n[keymap]\n"mode.cycle" = "f5"\n')
    cfg = load_tui_config()
    assert cfg.theme == "nord" and cfg.keymap == {"mode.cycle": "f5"} and cfg.problem is None
    (cfg_dir / "tui.toml").write_text("[keymap]\nx = 1\n")
    assert "ignored" in (load_tui_config().problem or "")


async def test_f1_lists_the_bindings_with_the_current_keys(make_app):
    app = make_app(tui_config=TuiConfig(keymap={"mode.cycle": "f5"}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        rows = app.screen.rows()
        assert ("Chat", "f5", "Mode", "mode.cycle") in rows
        assert ("Prompt", "^j, shift+⏎, alt+⏎", "Newline", "prompt.newline") in rows
        ids = {r[3] for r in rows}
        assert {"message.edit", "message.copy_code", "sessions.rename", "stop", "prompt.send"} <= ids
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


def test_every_palette_command_runs_an_existing_action():
    from radixchat.tui.commands import COMMANDS

    for title, _help, action in COMMANDS:
        name = action.split("(")[0]
        assert callable(getattr(RadixChatApp, f"action_{name}", None)), f"{title}: no action_{name}"
