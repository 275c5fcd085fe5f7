"""Chat behaviour through the UI over the fake backend: streaming, stop, footer, prompt keys, copy."""

from __future__ import annotations

import asyncio
import threading

from textual import events

from radixchat.chat.session import load_session, session_path
from radixchat.errors import ModelLoadError
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.user_message import UserMessage
from tests.tui.conftest import TERMINAL, Script, ready, say, say_mid_reply, turn_done, wait_until

CODE_REPLY = "Two ways:\n\n```python\nprint(1)\n```\n\nand\n\n```sh\necho 2\n```\n"


async def test_a_reply_streams_into_the_transcript_and_gets_a_footer(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hello")
        views = app.chat.transcript.messages()
        assert isinstance(views[0], UserMessage) and views[0].message.content == "hello"
        reply = views[-1]
        assert isinstance(reply, AssistantMessage)
        assert len(reply.streamed) > 1 and "".join(reply.streamed) == "You said: **hello**"
        assert reply.message.content == "You said: **hello**"
        footer = str(reply.query_one(".footer").render())
        assert footer.startswith("reused 0 · prefilled ") and footer.endswith("TTFT 12 ms · 42 tok/s")
        assert app.chat.prompt.text == ""


async def test_the_second_turn_reuses_the_first_turns_tokens(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "one")
        await say(app, pilot, "two")
        user, answer = app.chat.state.conv.messages[:2]
        footer = str(app.chat.transcript.last_assistant().query_one(".footer").render())
        # everything of turn one is cached except its last token (it has no KV yet)
        assert footer.startswith(f"reused {len(user.token_ids) + len(answer.token_ids) - 1} · ")
        assert answer.meta["mode"] == "chat"


async def test_escape_stops_the_reply_and_keeps_what_was_generated(make_app, fake):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say_mid_reply(app, pilot, fake, "go")
        await pilot.press("escape")
        await turn_done(app, pilot, 0)
        msg = app.chat.state.conv.messages[-1]
        assert msg.role == "assistant" and msg.finish_reason == "cancelled"
        assert msg.content == "ab"  # kept, not thrown away
        view = app.chat.transcript.last_assistant()
        assert view.has_class("-stopped")
        assert str(view.query_one(".footer").render()).startswith("■ stopped · reused 0")


async def test_typing_is_not_blocked_while_a_reply_streams(make_app, fake):
    fake.script = Script(chunk=1, gate=asyncio.Event())
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first", wait=False)
        await wait_until(lambda: app.chat.in_flight is not None, pilot=pilot)
        await pilot.press(*"next one")
        assert app.chat.prompt.text == "next one"
        await pilot.press("enter")  # refused while streaming: the text stays
        assert app.chat.prompt.text == "next one" and app.chat.in_flight is not None
        fake.script.gate.set()
        await turn_done(app, pilot, 0)
        await pilot.press("enter")
        await turn_done(app, pilot, 1)
        assert fake.script.replies == ["first", "next one"]


async def test_the_transcript_follows_the_stream_unless_the_user_scrolled_up(make_app, fake):
    fake.script = Script(reply_for=lambda p: "line\n\n" * 30, chunk=6)
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "a")
        await say(app, pilot, "b")
        t = app.chat.transcript
        await wait_until(lambda: t.max_scroll_y > 0 and t.scroll_y == t.max_scroll_y, pilot=pilot)
        fake.script.gate = asyncio.Event()
        await say(app, pilot, "c", wait=False)
        await wait_until(lambda: app.chat.in_flight is not None, pilot=pilot)
        for _ in range(5):
            t.post_message(events.MouseScrollUp(t, 2, 2, 0, -1, 0, False, False, False))
        await pilot.pause()
        fake.script.gate.set()
        await turn_done(app, pilot, 2)
        assert t.scroll_y < t.max_scroll_y  # left where the user put it


async def test_enter_sends_and_ctrl_j_inserts_a_newline(make_app, fake):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.press("l", "1", "ctrl+j", "l", "2")
        assert app.chat.prompt.text == "l1\nl2" and fake.script.replies == []
        await pilot.press("enter")
        await turn_done(app, pilot, 0)
        assert fake.script.replies == ["l1\nl2"]
        assert app.chat.prompt.text == ""


async def test_up_and_down_recall_earlier_prompts(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first")
        await say(app, pilot, "second")
        await pilot.press("d", "r", "a", "f", "t")
        await pilot.press("up")
        assert app.chat.prompt.text == "second"
        await pilot.press("up")
        assert app.chat.prompt.text == "first"
        await pilot.press("up")
        assert app.chat.prompt.text == "first"
        await pilot.press("down")
        assert app.chat.prompt.text == "second"
        await pilot.press("down")
        assert app.chat.prompt.text == "draft"


async def test_up_moves_the_cursor_inside_a_multiline_prompt(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "earlier")
        await pilot.press("a", "ctrl+j", "b", "up")
        assert app.chat.prompt.text == "a\nb" and app.chat.prompt.cursor_location[0] == 0
        await pilot.press("up")
        assert app.chat.prompt.text == "earlier"


async def test_copy_a_message_and_its_code_blocks(make_app, fake):
    fake.script = Script(reply_for=lambda p: CODE_REPLY)
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "show code")
        await pilot.press("shift+tab")
        assert isinstance(app.focused, AssistantMessage)
        await pilot.press("c")
        assert app.clipboard == CODE_REPLY
        await pilot.press("k")
        assert app.clipboard == "print(1)\n"
        await pilot.press("k")
        assert app.clipboard == "echo 2\n"
        await pilot.press("up")
        assert isinstance(app.focused, UserMessage)
        await pilot.press("c")
        assert app.clipboard == "show code"
        await pilot.press("i")
        assert app.focused is app.chat.prompt


async def test_enter_while_the_model_loads_queues_the_message(make_app, settings, fake):
    gate = threading.Event()

    def slow(s, progress):
        progress("converting the model")
        gate.wait(10)
        return fake

    from radixchat.tui.app import RadixChatApp

    app = RadixChatApp(settings, backend_factory=slow, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await wait_until(lambda: app.chat.load_status == "converting the model", pilot=pilot)
        assert "converting the model" in str(app.chat.transcript.query_one("Welcome .status").render())
        await pilot.press("h", "i", "enter")
        assert app.chat.prompt.text == "" and app.chat.turns.queued == "hi" and fake.script.replies == []
        assert [v.message.content for v in app.chat.transcript.query(".-queued")] == ["hi"]
        await pilot.press("x", "enter")  # one waiting message at a time: this one stays in the box
        assert app.chat.prompt.text == "x"
        gate.set()
        await turn_done(app, pilot, 0)
        assert (
            fake.script.replies == ["hi"]
            and app.chat.turns.queued is None
            and not app.chat.transcript.query(".-queued")
        )
        assert [type(v).__name__ for v in app.chat.transcript.messages()] == [
            "UserMessage",
            "AssistantMessage",
        ]


async def test_a_model_that_fails_to_load_is_reported_and_quit_returns_3(settings):
    def broken(s, progress):
        raise ModelLoadError("model 'nope' not found")

    from radixchat.tui.app import RadixChatApp

    app = RadixChatApp(settings, backend_factory=broken, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await wait_until(lambda: "failed to load" in app.chat.load_status, pilot=pilot)
        assert "model 'nope' not found" in str(app.chat.transcript.query_one("Welcome .status").render())
        await pilot.press("ctrl+q")
    assert app.return_code == 3


async def test_a_burst_of_keys_is_applied_in_order(make_app, fake):
    """Keys that arrive in one read (fast typing, tmux send-keys, a paste without bracketed paste):
    editing keys and Enter must act where they stand among the typed characters."""
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        for key in ["a", "b", "c", "backspace", "ctrl+j", "d", "left", "x", "enter"]:
            app.post_message(events.Key(key, key if len(key) == 1 else None))
        await turn_done(app, pilot, 0)
        assert fake.script.replies == ["ab\nxd"]
        assert app.chat.prompt.text == ""


async def test_quitting_in_the_middle_of_a_reply_exits_cleanly(make_app, fake):
    fake.script = Script(chunk=1, gate=asyncio.Event())
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "a long one", wait=False)
        await wait_until(lambda: app.chat.in_flight is not None, pilot=pilot)
        await pilot.press("ctrl+q")
    assert app.return_code == 0


async def test_quitting_mid_reply_saves_the_prompt_and_the_partial_reply(make_app, fake, settings):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first")
        await say_mid_reply(app, pilot, fake, "a long one")
        await pilot.press("ctrl+q")
    assert app.return_code == 0
    saved = load_session(session_path(settings.sessions_dir, app.chat.state.session_name))
    assert [m.content for m in saved.messages][-2:] == ["a long one", "ab"]
    assert saved.messages[-1].finish_reason == "cancelled"


async def test_the_activity_stays_readable_next_to_a_long_session_name(make_app, fake):
    app = make_app()
    async with app.run_test(size=(80, 30)) as pilot:
        await ready(app, pilot)
        app.chat.state.session_name = "a-rather-long-session-name-20261129-124324"
        fake.script = Script(chunk=1, gate=asyncio.Event())
        await say(app, pilot, "go", wait=False)
        await wait_until(lambda: app.chat.in_flight is not None, pilot=pilot)
        await pilot.pause()
        activity = app.query_one("StatusBar .activity")
        assert str(activity.render()).startswith("generating… (Esc stops)")
        assert activity.size.width >= len("generating… (Esc stops)")
        info = app.query_one("StatusBar .info")
        assert info.size.width <= 80 * 0.45 and str(info.render()).startswith("fake-model")
        fake.script.gate.set()
