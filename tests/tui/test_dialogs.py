"""The dialogs' keys act in the order they arrive: Ctrl+S (apply) after a burst of typing applies what
was typed before it — no less (a priority binding ran first) and no more (keys typed after it)."""

from __future__ import annotations

from radixchat.tui.screens.dialogs import NameDialog
from radixchat.tui.screens.schema import SchemaScreen
from radixchat.tui.screens.settings import SettingsScreen
from radixchat.tui.screens.tools import ToolsScreen
from tests.tui.conftest import TERMINAL, ToolFakeBackend, burst, call_then_answer, ready, wait_until


async def test_a_schema_typed_then_applied_in_one_burst_is_applied_whole(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.action_edit_schema()
        await wait_until(lambda: isinstance(app.screen, SchemaScreen), pilot=pilot)
        await pilot.pause()
        burst(app, "{", "enter", *'"type": "strinx', "backspace", *'g"}', "ctrl+s", *" junk")
        await wait_until(lambda: not isinstance(app.screen, SchemaScreen), pilot=pilot)
        assert app.chat.state.mode == "json" and app.chat.state.schema == {"type": "string"}


async def test_an_invalid_setting_typed_then_applied_in_one_burst_is_an_error(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        screen = app.screen
        screen.query_one("#f-temperature").focus()
        burst(app, "a", "b", "c", "ctrl+s")
        await wait_until(lambda: bool(str(screen.query_one("#settings-error").render())), pilot=pilot)
        assert app.screen is screen
        assert "temperature: 'abc' is not a number" in str(screen.query_one("#settings-error").render())
        assert app.chat.state.sampling.temperature is None
        burst(app, *["backspace"] * 3, "0", ".", "5", "ctrl+s")
        await wait_until(lambda: app.chat.state.sampling.temperature == 0.5, pilot=pilot)
        assert not isinstance(app.screen, SettingsScreen)


async def test_a_tool_toggled_then_applied_in_one_burst_is_dropped(make_app):
    app = make_app(backend=ToolFakeBackend(call_then_answer("calculator", {"expression": "1"})))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+t", "ctrl+t")
        await wait_until(lambda: app.chat.state.mode == "tool", pilot=pilot)
        await pilot.press("f4")
        await wait_until(lambda: isinstance(app.screen, ToolsScreen), pilot=pilot)
        await pilot.pause()
        burst(app, "down", "space", "ctrl+s")  # 'now' is no longer offered
        await wait_until(lambda: not isinstance(app.screen, ToolsScreen), pilot=pilot)
        assert app.chat.state.tool_names == ["calculator", "read_session_notes", "write_session_notes"]


async def test_a_name_typed_then_entered_in_one_burst_is_taken_whole(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        names: list[str | None] = []
        app.push_screen(NameDialog("Name"), names.append)
        await wait_until(lambda: isinstance(app.screen, NameDialog), pilot=pilot)
        await pilot.pause()
        burst(app, *"notex", "backspace", "s", "enter", *"more")
        await wait_until(lambda: bool(names), pilot=pilot)
        assert names == ["notes"]
