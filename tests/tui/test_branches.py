"""Regenerate and edit: both start a branch; the old one is kept, can be switched back to, shares the prefix."""

from __future__ import annotations

from radixchat.chat.session import load_session, session_path
from radixchat.tui.screens.branches import BranchesScreen
from radixchat.tui.widgets.user_message import UserMessage
from tests.tui.conftest import TERMINAL, FakeBackend, Script, ready, say, turn_done, wait_until


def counter_script() -> Script:
    n = {"i": 0}

    def reply(prompt: str) -> str:
        n["i"] += 1
        return f"reply {n['i']} to {prompt}"

    return Script(reply_for=reply)


async def test_regenerate_makes_a_new_reply_and_keeps_the_old_as_a_branch(make_app, fake):
    fake.script = counter_script()
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hi")
        await pilot.press("ctrl+r")
        await turn_done(app, pilot, 1)
        assert len(app.chat.state.branches) == 2
        assert [m.content for m in app.chat.state.conv.messages] == ["hi", "reply 2 to hi"]
        assert [m.content for m in app.chat.state.branches[0].conv.messages] == ["hi", "reply 1 to hi"]
        assert len(app.chat.transcript.messages()) == 2
        # the regenerated prompt was served from the cache (all but its last token)
        assert (
            app.chat.state.conv.messages[-1].meta["usage"]["cached_tokens"]
            == len(app.chat.state.conv.messages[0].token_ids) - 1
        )
        await app.chat.switch_branch(0)
        await pilot.pause()
        assert app.chat.transcript.last_assistant().message.content == "reply 1 to hi"


async def test_editing_an_earlier_message_creates_a_branch_sharing_the_prefix(make_app, fake):
    fake.script = counter_script()
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first")
        await say(app, pilot, "second")
        old = app.chat.state.conv
        # select the second user message: Shift+Tab to the last message, Up to the user message above it
        await pilot.press("shift+tab", "up")
        assert isinstance(app.focused, UserMessage) and app.focused.message.content == "second"
        await pilot.press("e")
        assert app.focused is app.chat.prompt and app.chat.prompt.text == "second"
        assert app.chat.state.editing == 2
        await pilot.press(
            "backspace", "backspace", "backspace", "backspace", "backspace", "backspace", *"2nd!"
        )
        await pilot.press("enter")
        await turn_done(app, pilot, 2)
        assert len(app.chat.state.branches) == 2
        new = app.chat.state.conv
        assert [m.content for m in new.messages[:3]] == ["first", "reply 1 to first", "2nd!"]
        assert [m.content for m in old.messages] == [
            "first",
            "reply 1 to first",
            "second",
            "reply 2 to second",
        ]
        assert app.chat.state.branches[0].conv is old and app.chat.state.active == 1
        # both branches share the cached prefix: the first turn's nodes are on both paths
        shared = len(new.messages[0].token_ids) + len(new.messages[1].token_ids)
        assert new.ids[:shared] == old.ids[:shared]
        path_new, path_old = fake.cached_path(new.ids), fake.cached_path(old.ids)
        assert path_new[0] == path_old[0] and path_new != path_old
        assert new.messages[-1].meta["usage"]["cached_tokens"] >= shared
        # and the old branch can be switched back to from the branch list
        await pilot.press("f3")
        assert isinstance(app.screen, BranchesScreen)
        await pilot.press("up", "enter")
        await wait_until(lambda: app.chat.state.active == 0, pilot=pilot)
        assert [v.message.content for v in app.chat.transcript.messages()][-1] == "reply 2 to second"
        assert "branch 1/2" in str(app.query_one("StatusBar .info").render())


async def test_escape_cancels_an_edit(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first")
        app.chat.action_edit_last()
        assert app.chat.state.editing == 0 and app.chat.prompt.text == "first"
        await pilot.press("escape")
        assert app.chat.state.editing is None and app.chat.prompt.text == ""
        assert len(app.chat.state.branches) == 1


async def test_branches_are_saved_and_come_back_when_the_session_is_reopened(make_app, fake, settings):
    fake.script = counter_script()
    app = make_app(session="forks")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first")
        await say(app, pilot, "second")
        await pilot.press("ctrl+r")  # branch 2: the second reply regenerated
        await turn_done(app, pilot, 2)
        app.chat.action_edit_last()  # branch 3: the second message edited
        app.chat.prompt.load_text("second, edited")
        await pilot.press("enter")
        await turn_done(app, pilot, 3)
        before = [
            (b.label, [m.content for m in b.conv.messages], b.conv.ids) for b in app.chat.state.branches
        ]
    saved = load_session(session_path(settings.sessions_dir, "forks"))
    assert [b.label for b in saved.branches] == ["main", "regenerated reply 2"]
    assert saved.messages[-2].content == "second, edited"

    second = FakeBackend(counter_script())
    app2 = make_app(backend=second, session=saved)
    async with app2.run_test(size=TERMINAL) as pilot:
        await ready(app2, pilot)
        after = [
            (b.label, [m.content for m in b.conv.messages], b.conv.ids) for b in app2.chat.state.branches
        ]
        # every branch where it was, with its label and token ids; the same one active
        assert after == before and app2.chat.state.active == 2
        assert "branch 3/3" in str(app2.query_one("StatusBar .info").render())
        await pilot.press("f3")
        await wait_until(lambda: isinstance(app2.screen, BranchesScreen), pilot=pilot)
        await pilot.press("up", "up", "enter")
        await wait_until(lambda: app2.chat.state.active == 0, pilot=pilot)
        assert [v.message.content for v in app2.chat.transcript.messages()][-1] == "reply 2 to second"
        await say(app2, pilot, "third")  # the old branch goes on, from its cached prefix
        assert app2.chat.state.conv.messages[-1].meta["usage"]["cached_tokens"] > 0
    resaved = load_session(session_path(settings.sessions_dir, "forks"))
    assert resaved.messages[-1].content == "reply 1 to third"
    assert [b.label for b in resaved.branches] == ["regenerated reply 2", before[2][0]]
    assert resaved.active_branch_label == "main" and resaved.active_branch_index == 0
