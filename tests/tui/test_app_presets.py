"""Presets in the app: chosen at start (``--preset``) or from the command palette."""

from __future__ import annotations

import pytest
from textual.command import CommandList
from textual.widgets import Select

from radixchat.config import Settings
from radixchat.tui.screens.settings import SettingsScreen
from tests.tui.conftest import TERMINAL, ready, wait_until

CONFIG = """
[presets.code]
description = "Terse coding help"
system_prompt = "You write Python."
temperature = 0.0
top_k = 1

[presets.facts]
mode = "tool"
tools = ["calculator"]
tool_choice = "required"

[presets.typo]
tools = ["calculater", "now"]
"""


@pytest.fixture
def preset_settings(tui_env):
    def load(**flags: str) -> Settings:
        path = tui_env / "presets.toml"
        path.write_text(CONFIG)
        base = {"sessions_dir": str(tui_env / "sessions"), "model": "fake-model", "max_tokens": "64"}
        return Settings.load({**base, **flags}, config_file=path)

    return load


async def test_a_preset_from_the_palette_sets_the_system_prompt_and_sampling(make_app, preset_settings):
    app = make_app(settings=preset_settings())
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Preset: code")
        commands = app.screen.query_one(CommandList)
        await wait_until(
            lambda: (
                commands.option_count > 0 and "Preset: code" in str(commands.get_option_at_index(0).prompt)
            ),
            pilot=pilot,
        )
        await pilot.press("enter")
        state = app.chat.state
        await wait_until(lambda: state.system_prompt == "You write Python.", pilot=pilot)
        assert (state.sampling.temperature, state.sampling.top_k, state.sampling.top_p) == (0.0, 1, None)
        assert state.conv.messages[0].content == "You write Python."
        assert any("Preset 'code' applied" in str(n.message) for n in app._notifications)


async def test_a_preset_from_the_palette_sets_the_mode_and_tools(make_app, preset_settings):
    app = make_app(settings=preset_settings())
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await app.chat.action_apply_preset("facts")
        state = app.chat.state
        assert (state.mode, state.tool_names, state.tool_choice) == ("tool", ["calculator"], "required")


async def test_the_preset_given_at_start_sets_the_mode_and_tools(make_app, preset_settings):
    app = make_app(settings=preset_settings(preset="facts"))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        state = app.chat.state
        assert (state.mode, state.tool_names, state.tool_choice) == ("tool", ["calculator"], "required")


async def test_the_preset_given_at_start_is_the_sampling_default(make_app, preset_settings):
    app = make_app(settings=preset_settings(preset="code"))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        params = app.chat.core.params()
        assert (params.temperature, params.top_k) == (0.0, 1)
        assert app.chat.state.conv.messages[0].content == "You write Python."


async def test_tools_a_preset_names_that_do_not_exist_are_said_and_left_out(make_app, preset_settings):
    app = make_app(settings=preset_settings())
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await app.chat.action_apply_preset("typo")
        assert [t.name for t in app.chat.core.offered_tools()] == ["now"]
        await pilot.pause()
        assert any("no tool named 'calculater'" in str(n.message) for n in app._notifications)
    app = make_app(settings=preset_settings(preset="typo"))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert any("preset 'typo': no tool named 'calculater'" in str(n.message) for n in app._notifications)


async def test_a_preset_chosen_in_the_settings_screen_fills_the_fields_and_applies_with_its_mode(
    make_app, preset_settings
):
    app = make_app(settings=preset_settings())
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        screen = app.screen
        screen.query_one("#preset", Select).value = "code"
        await wait_until(lambda: screen.query_one("#f-temperature").value == "0.0", pilot=pilot)
        assert screen.query_one("#system-prompt").text == "You write Python."
        assert (screen.query_one("#f-top_k").value, screen.query_one("#f-top_p").value) == ("1", "")
        screen.query_one("#f-top_p").value = "0.5"  # edited after the preset filled the fields in
        await pilot.press("ctrl+s")
        state = app.chat.state
        await wait_until(lambda: state.system_prompt == "You write Python.", pilot=pilot)
        assert (state.sampling.temperature, state.sampling.top_k, state.sampling.top_p) == (0.0, 1, 0.5)
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        app.screen.query_one("#preset", Select).value = "facts"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await wait_until(lambda: state.mode == "tool", pilot=pilot)
        assert (state.tool_names, state.tool_choice) == (["calculator"], "required")


async def test_without_presets_the_settings_screen_has_no_preset_choice(make_app, settings):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        assert not app.screen.query("#preset")
