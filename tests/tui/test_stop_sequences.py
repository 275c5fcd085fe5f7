"""Stop sequences: a setting of the config file, and a per-session field of the settings screen (F2)."""

from __future__ import annotations

import json

from radixchat.chat.session import SamplingSettings, SessionFile, load_session, session_path
from radixchat.tui.screens.settings import SettingsScreen, parse_stop
from tests.tui.conftest import TERMINAL, ready, say, wait_until


def test_stop_sequences_are_a_json_list_of_strings():
    assert parse_stop("") is None
    assert parse_stop('["\\n\\n", "User:"]') == ["\n\n", "User:"]
    for bad in ("User:", "[1]", '[""]', '{"a": 1}'):
        try:
            parse_stop(bad)
        except ValueError as exc:
            assert str(exc).startswith("stop sequences: a JSON list")
        else:
            raise AssertionError(bad)


def test_a_session_without_stop_sequences_is_saved_as_before_them():
    """Left out while unset, so a radixchat from before stop sequences still reads the file."""
    data = json.loads(SessionFile(name="x", model="m").model_dump_json(by_alias=True))
    assert "stop" not in data["sampling"]
    assert SamplingSettings(stop=["END"]).model_dump()["stop"] == ["END"]


async def test_stop_sequences_set_in_the_settings_screen_reach_the_reply_and_the_file(make_app, settings):
    app = make_app(session="stops")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert app.chat.core.params().stop == ()
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        screen = app.screen
        assert screen.query_one("#f-max_tokens").placeholder == "default 64"
        screen.query_one("#f-stop").value = "User:"
        await pilot.press("ctrl+s")
        assert "a JSON list" in str(screen.query_one("#settings-error").render())
        screen.query_one("#f-stop").value = '["\\n\\n", "User:"]'
        screen.query_one("#f-max_tokens").value = "20"
        await pilot.press("ctrl+s")
        await wait_until(lambda: app.chat.state.sampling.stop == ["\n\n", "User:"], pilot=pilot)
        params = app.chat.core.params()
        assert params.stop == ("\n\n", "User:") and params.max_tokens == 20
        await say(app, pilot, "hi")
        saved = load_session(session_path(settings.sessions_dir, "stops"))
        assert saved.sampling.stop == ["\n\n", "User:"] and saved.sampling.max_tokens == 20
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        assert app.screen.query_one("#f-stop").value == '["\\n\\n", "User:"]'


async def test_the_config_files_stop_sequences_are_the_default(make_app, settings):
    app = make_app(settings=settings.model_copy(update={"stop": ["###"]}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert app.chat.core.params().stop == ("###",)
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        assert app.screen.query_one("#f-stop").placeholder.startswith('default ["###"]')
