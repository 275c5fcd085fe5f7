"""Sessions through the UI: autosave, save with a name, open (round trip), browser, other models, settings."""

from __future__ import annotations

import json

import pytest

from radixchat.chat.session import SessionFile, load_session, save_session, session_path
from radixchat.errors import SessionError
from radixchat.tui.app import RadixChatApp, run_app
from radixchat.tui.screens.dialogs import ConfirmDialog, NameDialog
from radixchat.tui.screens.sessions import SessionsScreen
from radixchat.tui.screens.settings import SettingsScreen
from radixchat.tui.session_store import session_markdown
from tests.tui.conftest import TERMINAL, FakeBackend, ready, say, say_mid_reply, wait_until


async def test_each_completed_turn_is_autosaved(make_app, settings):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "remember me")
        name = app.chat.state.session_name
        assert name and name.startswith("chat-") and app.chat.state.auto_named
        path = session_path(settings.sessions_dir, name)
        await wait_until(path.exists, pilot=pilot)
        saved = load_session(path)
        assert [m.content for m in saved.messages] == ["remember me", "You said: **remember me**"]
        assert saved.messages[0].token_ids == app.chat.state.conv.messages[0].token_ids
        assert saved.model == "fake-model"
        assert not list(settings.sessions_dir.glob(".*.tmp"))  # atomic: no temp file left behind


async def test_save_asks_for_a_name_and_replaces_the_autosaved_file(make_app, settings):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hi")
        auto = session_path(settings.sessions_dir, app.chat.state.session_name)
        await wait_until(auto.exists, pilot=pilot)
        await pilot.press("ctrl+s")
        await wait_until(lambda: isinstance(app.screen, NameDialog), pilot=pilot)
        app.screen.query_one("Input").value = "recipes"
        await pilot.press("enter")
        target = session_path(settings.sessions_dir, "recipes")
        await wait_until(target.exists, pilot=pilot)
        assert (
            not auto.exists() and app.chat.state.session_name == "recipes" and not app.chat.state.auto_named
        )
        await say(app, pilot, "more")
        assert len(load_session(target).messages) == 4


async def test_a_saved_session_opens_with_its_history_settings_and_a_warm_cache(make_app, settings, tmp_path):
    first = FakeBackend()
    app = make_app(backend=first, session="trip")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.state.sampling = app.chat.state.sampling.model_copy(update={"temperature": 0.2})
        await say(app, pilot, "plan a trip")
        await say(app, pilot, "to Lisbon")
        ids = app.chat.state.conv.ids
    path = session_path(settings.sessions_dir, "trip")
    session = load_session(path)
    assert session.sampling.temperature == 0.2

    second = FakeBackend()  # a fresh engine: nothing cached until the history is warmed
    app2 = make_app(backend=second, session=session)
    async with app2.run_test(size=TERMINAL) as pilot:
        await ready(app2, pilot)
        assert [v.message.content for v in app2.chat.transcript.messages()][::2] == [
            "plan a trip",
            "to Lisbon",
        ]
        assert app2.chat.state.conv.ids == ids and app2.chat.state.sampling.temperature == 0.2
        await wait_until(lambda: second.warmed == [ids], pilot=pilot)
        assert app2.chat.state.session_name == "trip"
        await pilot.press("up")
        assert app2.chat.prompt.text == "to Lisbon"  # the prompt history came along
        app2.chat.prompt.clear()
        await say(app2, pilot, "and back")
        usage = app2.chat.state.conv.messages[-1].meta["usage"]
        assert usage["cached_tokens"] == len(ids) - 1  # the whole history was a cache hit


async def test_a_session_from_another_model_opens_re_tokenized_with_a_note(make_app, settings):
    session = SessionFile(
        name="old",
        model="other-model",
        messages=[
            {"role": "user", "content": "hello", "token_ids": [5, 6, 7]},
            {"role": "assistant", "content": "hi there", "token_ids": [8, 9]},
        ],
    )
    fake = FakeBackend()
    app = make_app(backend=fake, session=session)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        notes = [str(n.render()) for n in app.chat.transcript.query("Note")]
        assert any("saved with other-model" in n and "continues with fake-model" in n for n in notes)
        assert all(
            not m.token_ids for m in app.chat.state.conv.messages
        )  # the other tokenizer's ids are dropped
        await wait_until(lambda: bool(fake.warmed), pilot=pilot)
        assert fake.fmt.decode(fake.warmed[0]).startswith("<|im_start|>user\nhello")
        await say(app, pilot, "again")
        assert app.chat.state.conv.messages[-1].meta["usage"]["cached_tokens"] > 0
        await wait_until(
            lambda: load_session(session_path(settings.sessions_dir, "old")).model == "fake-model",
            pilot=pilot,
        )


async def test_the_session_browser_opens_renames_deletes_and_exports(make_app, settings):
    for name, text in (("alpha", "a"), ("beta", "b")):
        s = SessionFile(
            name=name,
            model="fake-model",
            messages=[{"role": "user", "content": text}, {"role": "assistant", "content": f"re {text}"}],
        )
        save_session(s, session_path(settings.sessions_dir, name))
    (settings.sessions_dir / "broken.json").write_text("{not json")
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+o")
        await wait_until(
            lambda: isinstance(app.screen, SessionsScreen) and len(app.screen.entries) == 3, pilot=pilot
        )
        screen = app.screen
        table = screen.query_one("DataTable")
        rows = {table.get_row_at(i)[0]: table.get_row_at(i) for i in range(table.row_count)}
        assert rows["alpha"][1:3] == ["fake-model", "1"] and rows["broken"][1] == "⚠ unreadable"
        names = [e.name for e in screen.entries]
        table.move_cursor(row=names.index("beta"))
        await pilot.press("x")
        md = settings.sessions_dir / "beta.md"
        await wait_until(md.exists, pilot=pilot)
        assert "## Assistant\n\nre b" in md.read_text()
        await pilot.press("r")
        await wait_until(lambda: isinstance(app.screen, NameDialog), pilot=pilot)
        app.screen.query_one("Input").value = "gamma"
        await pilot.press("enter")
        await wait_until(lambda: session_path(settings.sessions_dir, "gamma").exists(), pilot=pilot)
        assert not session_path(settings.sessions_dir, "beta").exists()
        assert load_session(session_path(settings.sessions_dir, "gamma")).name == "gamma"
        await wait_until(lambda: "gamma" in [e.name for e in screen.entries], pilot=pilot)
        table.move_cursor(row=[e.name for e in screen.entries].index("alpha"))
        await pilot.press("d")
        await wait_until(lambda: isinstance(app.screen, ConfirmDialog), pilot=pilot)
        await pilot.press("y")
        await wait_until(lambda: not session_path(settings.sessions_dir, "alpha").exists(), pilot=pilot)
        await wait_until(lambda: len(screen.entries) == 2, pilot=pilot)
        table.move_cursor(row=[e.name for e in screen.entries].index("gamma"))
        await pilot.press("enter")
        await wait_until(lambda: app.chat.state.session_name == "gamma", pilot=pilot)
        assert [v.message.content for v in app.chat.transcript.messages()] == ["b", "re b"]
        assert (settings.sessions_dir / "broken.json").read_text() == "{not json"  # never rewritten


def test_run_app_refuses_a_corrupt_session_before_starting(settings):
    settings.sessions_dir.mkdir(parents=True)
    (settings.sessions_dir / "bad.json").write_text(json.dumps({"version": 1, "name": "bad"}))
    with pytest.raises(SessionError, match="invalid"):
        run_app(settings, session="bad", backend_factory=lambda s, p: FakeBackend())


async def test_session_settings_set_sampling_and_a_new_system_prompt_starts_a_branch(make_app, settings):
    app = make_app(session="tuned")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hi")
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        screen = app.screen
        screen.query_one("#f-temperature").value = "9"
        await pilot.press("ctrl+s")
        assert "temperature must be ≤ 5.0" in str(screen.query_one("#settings-error").render())
        screen.query_one("#f-temperature").value = "0.3"
        screen.query_one("#f-seed").value = "7"
        screen.query_one("#system-prompt").load_text("Be brief.")
        await pilot.press("ctrl+s")
        await wait_until(lambda: app.chat.state.system_prompt == "Be brief.", pilot=pilot)
        assert app.chat.state.sampling.temperature == 0.3 and app.chat.state.sampling.seed == 7
        assert len(app.chat.state.branches) == 2 and app.chat.state.conv.system == "Be brief."
        await say(app, pilot, "again")
        assert app.chat.state.conv.messages[0].role == "system"
        saved = load_session(session_path(settings.sessions_dir, "tuned"))
        assert saved.system_prompt == "Be brief." and saved.sampling.seed == 7
        await app.chat.switch_branch(0)  # the first branch was made without a system prompt
        assert app.chat.state.system_prompt is None
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        assert app.screen.query_one("#system-prompt").text == ""


def test_markdown_export_reads_like_the_chat():
    s = SessionFile(
        name="demo",
        model="m",
        system_prompt="Be kind.",
        messages=[
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "hello",
                "meta": {
                    "usage": {"prompt_tokens": 10, "cached_tokens": 4},
                    "ttft_ms": 50.0,
                    "decode_tokens_per_s": 20.0,
                },
            },
        ],
    )
    md = session_markdown(s)
    assert md.startswith("# demo\n")
    assert "> **System:** Be kind." in md and "## User\n\nhi" in md
    assert "<sub>reused 4 · prefilled 6 · TTFT 50 ms · 20 tok/s</sub>" in md


def test_run_app_opens_a_named_session_and_names_a_new_one(settings, monkeypatch):
    seen = []
    monkeypatch.setattr(
        RadixChatApp,
        "run",
        lambda self: seen.append((self.chat.core.pending_session, self.chat.state.session_name)),
    )
    save_session(SessionFile(name="kept", model="fake-model"), session_path(settings.sessions_dir, "kept"))
    assert run_app(settings, session="kept") == 0
    assert run_app(settings, session="fresh") == 0
    (opened, _), (pending, name) = seen
    assert opened.name == "kept" and pending is None and name == "fresh"


def test_markdown_export_shows_tool_calls_and_results_not_call_json():
    s = SessionFile(
        name="calc",
        model="m",
        mode="tool",
        messages=[
            {"role": "user", "content": "6*7?"},
            {
                "role": "assistant",
                "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
                "tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}],
            },
            {"role": "tool", "name": "calculator", "content": "42"},
            {"role": "assistant", "content": "It is 42."},
        ],
    )
    md = session_markdown(s)
    assert "<tool_call>" not in md
    assert '- calls `calculator(expression="6*7")`' in md and "## Tool calculator\n\n```\n42\n```" in md


async def test_a_new_chat_in_the_middle_of_a_reply_saves_that_turn_first(make_app, fake, settings):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first")
        name = app.chat.state.session_name
        await say_mid_reply(app, pilot, fake, "tell me about ships")
        await pilot.press("ctrl+n")
        await wait_until(lambda: app.chat.state.session_name != name, pilot=pilot)
    saved = load_session(session_path(settings.sessions_dir, name))
    assert [m.content for m in saved.messages][-2:] == ["tell me about ships", "ab"]
    assert saved.messages[-1].finish_reason == "cancelled"


async def test_opening_a_session_in_the_middle_of_an_unsaved_chat_saves_the_chat(make_app, fake, settings):
    other = SessionFile(name="other", model="fake-model", messages=[])
    save_session(other, session_path(settings.sessions_dir, "other"))
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say_mid_reply(app, pilot, fake, "say hi")
        # As the session browser does: from a handler on the app's message queue, where the reply's
        # end-of-turn message waits behind it.
        app.call_later(app.chat.open_session, load_session(session_path(settings.sessions_dir, "other")))
        await wait_until(lambda: app.chat.state.session_name == "other", pilot=pilot)
        await pilot.pause()
    chats = [p for p in settings.sessions_dir.glob("chat-*.json")]
    assert len(chats) == 1
    assert [m.content for m in load_session(chats[0]).messages] == ["say hi", "ab"]


async def test_the_settings_placeholders_say_what_a_blank_field_means(make_app, settings):
    app = make_app(settings=settings.model_copy(update={"top_k": 40}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        screen = app.screen
        assert screen.query_one("#f-seed").placeholder == "default random"  # as radixchat --help says
        assert screen.query_one("#f-top_k").placeholder == "default 40"
        screen.query_one("#f-seed").value = "-1"  # the engine takes 0 … 2**63 - 1
        await pilot.press("ctrl+s")
        assert "seed must be ≥ 0" in str(screen.query_one("#settings-error").render())


async def test_an_unreadable_session_is_renamed_or_deleted_as_a_file_and_export_says_why(make_app, settings):
    settings.sessions_dir.mkdir(parents=True)
    (settings.sessions_dir / "broken.json").write_text("{not json")
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("ctrl+o")
        await wait_until(lambda: isinstance(app.screen, SessionsScreen) and app.screen.entries, pilot=pilot)
        screen = app.screen
        await pilot.press("x")
        await wait_until(lambda: bool(app._notifications), pilot=pilot)
        (note,) = list(app._notifications)
        assert note.title == "Cannot export" and "broken.json does not load" in note.message
        assert not (settings.sessions_dir / "broken.md").exists()
        await pilot.press("r")
        await wait_until(lambda: isinstance(app.screen, NameDialog), pilot=pilot)
        assert "the unreadable file broken.json" in str(app.screen.query_one(".dialog-title").render())
        app.screen.query_one("Input").value = "kept aside"
        await pilot.press("enter")
        moved = settings.sessions_dir / "kept-aside.json"
        await wait_until(moved.exists, pilot=pilot)
        assert moved.read_text() == "{not json"  # moved as it is, never rewritten
        assert not (settings.sessions_dir / "broken.json").exists()
        await wait_until(lambda: [e.name for e in screen.entries] == ["kept-aside"], pilot=pilot)
        assert app.chat.state.session_name != "kept aside"  # the chat in the app is another one
        await pilot.press("d")
        await wait_until(lambda: isinstance(app.screen, ConfirmDialog), pilot=pilot)
        await pilot.press("n")  # asks first
        await wait_until(lambda: app.screen is screen, pilot=pilot)
        assert moved.exists()
        await pilot.press("d")
        await wait_until(lambda: isinstance(app.screen, ConfirmDialog), pilot=pilot)
        await pilot.press("y")
        await wait_until(lambda: not moved.exists(), pilot=pilot)
        await wait_until(lambda: not screen.entries, pilot=pilot)


def test_markdown_export_puts_json_mode_replies_in_a_json_code_block():
    s = SessionFile(
        name="data",
        model="m",
        mode="json",
        messages=[
            {"role": "user", "content": "a person"},
            {"role": "assistant", "content": '{"name": "Ada", "note": "```"}', "meta": {"mode": "json"}},
            {"role": "user", "content": "another"},
            {"role": "assistant", "content": '{"name": "Gr', "meta": {"mode": "json"}},  # stopped
            {"role": "user", "content": "say hi"},
            {"role": "assistant", "content": "hi", "meta": {"mode": "chat"}},
        ],
    )
    md = session_markdown(s)
    assert '## Assistant\n\n````json\n{\n  "name": "Ada",\n  "note": "```"\n}\n````\n' in md
    assert '## Assistant\n\n```json\n{"name": "Gr\n```\n' in md
    assert "## Assistant\n\nhi\n" in md
