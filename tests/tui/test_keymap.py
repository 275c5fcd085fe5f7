"""Bindings: every one has an id, config.toml's [keymap] remaps them, F1 lists them; the theme setting."""

from __future__ import annotations

from textual.binding import Binding

from radixchat.config import Settings
from radixchat.tui.app import RadixChatApp
from radixchat.tui.chat_screen import ChatScreen
from radixchat.tui.keymap import binding_groups, check_keymap
from radixchat.tui.screens.help import HelpScreen
from tests.tui.conftest import TERMINAL, ready, say


def with_keymap(settings: Settings, keymap: dict[str, str]) -> Settings:
    return settings.model_copy(update={"keymap": keymap})


def test_every_binding_has_a_unique_id():
    ids = []
    for title, bindings in binding_groups():
        for b in bindings:
            assert isinstance(b, Binding) and b.id, f"{title}: {b} has no id"
            ids.append(b.id)
    assert len(ids) == len(set(ids))


def test_every_widget_and_screen_with_bindings_is_in_the_help_groups():
    import radixchat.tui.screens as screens
    import radixchat.tui.widgets as widgets
    from tests.test_layering import TUI

    listed = {b.id for _t, bindings in binding_groups() for b in bindings}
    for package, folder in ((screens, "screens"), (widgets, "widgets")):
        for path in (TUI / folder).glob("*.py"):
            module = __import__(f"{package.__name__}.{path.stem}", fromlist=["_"])
            for obj in vars(module).values():
                if isinstance(obj, type) and obj.__module__ == module.__name__:
                    for b in obj.__dict__.get("BINDINGS", []):
                        assert b.id in listed, f"{obj.__name__}: {b.id} is missing from F1"


async def test_a_keymap_override_moves_a_binding(make_app, settings):
    app = make_app(settings=with_keymap(settings, {"mode.cycle": "f5"}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert app.chat.state.mode == "chat"
        await pilot.press("f5")
        await pilot.pause()
        assert app.chat.state.mode == "json"


async def test_the_prompt_send_key_can_be_remapped(make_app, fake, settings):
    app = make_app(settings=with_keymap(settings, {"prompt.send": "ctrl+s", "session.save": "f9"}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("a", "enter", "b")
        assert app.chat.prompt.text == "a\nb"  # Enter is a plain newline now
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert fake.script.replies == ["a\nb"]


async def test_theme_and_keymap_come_from_the_config_file(make_app, tui_env):
    cfg_dir = tui_env / "config" / "radixchat"
    cfg_dir.mkdir(parents=True)
    (cfg_dir / "config.toml").write_text(
        'theme = "nord"\nmodel = "fake-model"\n[keymap]\n"mode.cycle" = "f5"\n"no.such" = "f6"\n'
    )
    settings = Settings.load({"sessions_dir": str(tui_env / "sessions")})
    assert settings.theme == "nord" and settings.keymap == {"mode.cycle": "f5", "no.such": "f6"}
    app = make_app(settings=settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert app.theme == "nord"
        await pilot.press("f5")
        await pilot.pause()
        assert app.chat.state.mode == "json"
        warnings = [str(n.message) for n in app._notifications]
        assert any("'no.such'" in w and "F1 lists them" in w for w in warnings)


async def test_an_unknown_theme_is_reported_and_the_default_kept(make_app, settings):
    app = make_app(settings=settings.model_copy(update={"theme": "no-such-theme"}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert app.theme == "textual-dark"
        assert any("unknown theme 'no-such-theme'" in str(n.message) for n in app._notifications)


def test_check_keymap_names_unknown_ids_only():
    assert check_keymap({"mode.cycle": "f5", "consent.deny": "x"}) is None
    assert "'nope'" in (check_keymap({"nope": "f5"}) or "")


async def test_f1_lists_the_bindings_with_the_current_keys(make_app, settings):
    app = make_app(settings=with_keymap(settings, {"mode.cycle": "f5"}))
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
        assert {"consent.once", "consent.always", "consent.deny", "tools.apply"} <= ids
        assert ("Chat", "^q", "Quit", "quit") in rows and ("Chat", "^p", "palette", "palette") in rows
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


def test_every_palette_command_runs_an_existing_action():
    from radixchat.tui.commands import COMMANDS

    for title, _help, action in COMMANDS:
        name = action.split("(")[0]
        owner = RadixChatApp if name.startswith("app.") else ChatScreen  # the chat screen's, unless app.
        name = name.removeprefix("app.")
        assert callable(getattr(owner, f"action_{name}", None)), f"{title}: no action_{name}"


def test_f1_lists_every_binding_of_the_app_textuals_own_included(make_app):
    listed = {b.id for _t, bindings in binding_groups() for b in bindings}
    app = make_app()  # Textual adds the palette's binding when the app is made
    for key, b in app._bindings:
        assert b.system or b.id in listed, f"{key} ({b.action}) is missing from F1"


def test_no_app_key_is_taken_by_the_prompt():
    """The prompt has the focus most of the time; an app key that it binds too does nothing there."""
    from radixchat.tui.widgets.prompt import PromptInput

    prompt_keys = set(PromptInput._merged_bindings.key_to_bindings)  # TextArea's editing keys included
    for b in [*ChatScreen.BINDINGS, *RadixChatApp.BINDINGS]:
        assert isinstance(b, Binding)
        if not b.priority:
            taken = {k.strip() for k in b.key.split(",")} & prompt_keys
            assert not taken, f"{b.id}: {taken} is the prompt's"


async def test_the_copy_reply_key_works_from_the_prompt(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hi")
        await pilot.press("d", "r", "a", "f", "t")
        assert app.focused is app.chat.prompt
        await pilot.press("ctrl+g")
        assert app.clipboard == "You said: **hi**"
        assert app.chat.prompt.text == "draft"
