"""Modes: switching (key and palette), always visible, ModeError shown clearly, JSON schema UI (tool mode: test_tool_mode.py)."""

from __future__ import annotations

import json

from textual.command import CommandList

import radixchat.tui.chat_core as chat_core
from radixchat.tui.screens.schema import SchemaScreen, parse_schema
from radixchat.tui.widgets.assistant_message import display_text
from tests.tui.conftest import TERMINAL, Script, ready, say, wait_until


def mode_badge(app) -> str:
    return str(app.query_one("StatusBar .mode").render()).strip()


async def test_ctrl_t_cycles_the_modes_and_the_mode_is_always_shown(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert mode_badge(app) == "chat"
        seen = []
        for _ in range(3):
            await pilot.press("ctrl+t")
            await pilot.pause()
            seen.append((app.chat.state.mode, mode_badge(app).split()[0]))
        assert seen == [("json", "json"), ("tool", "tool"), ("chat", "chat")]


async def test_an_unavailable_mode_says_why_and_keeps_the_message(make_app, fake):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert "json mode is not available" in app.chat.mode_problem
        assert "⚠" in mode_badge(app)
        assert "not available" in str(app.query_one("StatusBar .activity").render())
        await pilot.press(*"hello", "enter")
        await pilot.pause()
        assert fake.script.replies == [] and app.chat.prompt.text == "hello"
        assert any("not available" in str(n.message) for n in app._notifications)


async def test_modes_can_be_chosen_from_the_command_palette(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*"Mode: tool")
        commands = app.screen.query_one(CommandList)
        await wait_until(
            lambda: commands.option_count > 0 and "Mode: tool" in str(commands.get_option_at_index(0).prompt),
            pilot=pilot,
        )
        await pilot.press("enter")
        await wait_until(lambda: app.chat.state.mode == "tool", pilot=pilot)
        assert mode_badge(app).startswith("tool")


async def test_json_mode_replies_are_pretty_printed(make_app, fake, monkeypatch):
    monkeypatch.setattr(chat_core, "grammar_for", lambda backend, spec: None)
    fake.script = Script(reply_for=lambda p: '{"name": "Ada", "langs": ["en", "fr"]}')
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await app.chat.action_set_mode("json")
        assert app.chat.mode_problem is None and mode_badge(app) == "json"
        await say(app, pilot, "who?")
        view = app.chat.transcript.last_assistant()
        assert view.mode == "json" and view.message.meta["mode"] == "json"
        assert view.body.source == display_text(view.message.content, "json")
        assert '"langs": [\n    "en",' in view.body.source
        assert view.message.content == '{"name": "Ada", "langs": ["en", "fr"]}'  # the exact text is kept


def test_display_text_leaves_invalid_json_alone():
    assert display_text("{oops", "json") == "{oops"
    assert display_text('{"a":1}', "chat") == '{"a":1}'
    assert display_text('{"a":1}', "json") == '```json\n{\n  "a": 1\n}\n```'


def test_parse_schema_explains_what_is_wrong():
    assert parse_schema("") is None
    assert parse_schema('{"type": "object"}') == {"type": "object"}
    for bad, why in (("{", "not valid JSON"), ("[1]", "is an object")):
        try:
            parse_schema(bad)
        except ValueError as exc:
            assert why in str(exc)
        else:
            raise AssertionError(bad)


async def test_the_json_schema_is_pasted_or_loaded_from_a_file(make_app, tmp_path):
    schema_file = tmp_path / "person.json"
    schema_file.write_text(json.dumps({"type": "object", "required": ["name"]}))
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.action_edit_schema()
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SchemaScreen)
        screen.query_one("#schema-text").load_text("{broken")
        await pilot.press("ctrl+s")
        assert "not valid JSON" in str(screen.query_one("#schema-error").render())
        screen.query_one("#schema-path").value = str(schema_file)
        screen.load_file()
        await pilot.press("ctrl+s")
        await wait_until(lambda: app.chat.state.mode == "json", pilot=pilot)
        assert app.chat.state.schema == {"type": "object", "required": ["name"]}
