"""The model's context in view: the status bar and the memory panel show the share the conversation uses, the
app says so from 80%, and turns that leave the context stay on screen, dimmed, with a notice."""

from __future__ import annotations

from radixchat.chat.session import load_session, session_path
from radixchat.tui.widgets.status_bar import StatusBar
from tests.tui.conftest import TERMINAL, Script, ready, say


def _notices(app) -> list[str]:
    return [n.message for n in app._notifications]


def _status(app) -> str:
    return str(app.chat.query_one(StatusBar).query_one(".info").render())


async def test_the_status_bar_shows_the_share_of_the_context(make_app, fake):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hello")
        used = len(app.chat.state.conv.ids)
        assert f"context {used / 4096:.0%}" in _status(app)
        await app.chat.refresh_panels_now()
        memory = str(app.chat.query_one("#memory").render())
        assert f"context {used:,}/4,096 tok" in memory


async def test_from_80_percent_the_app_says_the_context_is_filling_up_once(make_app, fake):
    fake.context_tokens = 1000
    fake.script = Script(reply_for=lambda p: "ok " * 20)
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        filling = lambda: [n for n in _notices(app) if "of the model's context" in n]  # noqa: E731
        while len(app.chat.state.conv.ids) < 0.8 * 1000:
            assert not filling()
            await say(app, pilot, "x" * 30)
        assert app.chat.state.conv.dropped_turns == 0
        assert len(filling()) == 1 and "the oldest turns will leave" in filling()[0]
        assert app.chat.query_one(StatusBar).query_one(".info").has_class("-context-full")
        await say(app, pilot, "once is enough")
        assert len(filling()) == 1


async def test_turns_that_leave_the_context_stay_on_screen_dimmed_and_in_the_session(
    make_app, fake, settings
):
    fake.context_tokens = 400
    fake.script = Script(reply_for=lambda p: "ok " * 20)
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        for i in range(8):
            await say(app, pilot, f"message {i} " + "z" * 30)
        conv = app.chat.state.conv
        assert conv.dropped_turns >= 1
        assert any("left the model's context" in n for n in _notices(app))
        views = app.chat.transcript.messages()
        assert len(views) == 16  # nothing left the screen
        dimmed = [v for v in views if v.has_class("-dropped")]
        assert dimmed and all(v.message.dropped for v in dimmed)
        assert dimmed[0].message.content.startswith("message 0") and dimmed[0].border_subtitle
        assert not views[-1].has_class("-dropped")
        saved = load_session(session_path(settings.sessions_dir, app.chat.state.session_name))
        assert [m.dropped for m in saved.messages] == [m.dropped for m in conv.messages]


async def test_a_long_transcript_lays_out_its_last_messages_and_shows_earlier_ones_on_request(make_app, fake):
    """Only the last VISIBLE messages take part in layout (every streaming write lays the screen out);
    the earlier ones are one line away: click it, or Up from the first shown message."""
    from radixchat.tui.widgets.transcript import VISIBLE, EarlierMessages

    fake.script = Script(reply_for=lambda p: "ok")
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        for i in range(VISIBLE // 2 + 5):
            await say(app, pilot, f"m{i}")
        transcript = app.chat.transcript
        views = transcript.messages()
        shown = [v for v in views if v.display]
        assert len(views) == VISIBLE + 10 and len(shown) == VISIBLE and shown[-1] is views[-1]
        note = transcript.query_one(EarlierMessages)
        assert note.display and "10 earlier messages" in str(note.render())
        shown[0].focus()
        await pilot.press("up")  # from the first shown message: the earlier ones appear, focus moves up
        await pilot.pause()
        assert all(v.display for v in transcript.messages()) and not note.display
        assert app.focused is views[9]
        await say(app, pilot, "one more")  # the next turn hides the oldest again
        assert sum(v.display for v in transcript.messages()) == VISIBLE
        transcript.scroll_home(animate=False)  # scrolled up to it, as a user would
        await pilot.pause()
        await pilot.click(EarlierMessages)
        assert all(v.display for v in transcript.messages())
