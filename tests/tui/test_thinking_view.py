"""A thinking model in the app (a real remote backend on the scripted fake server, which streams
``reasoning_content``): the thinking streams into a folded block above the answer, F6 shows or hides every
reply's thinking, the footer counts thinking tokens apart, and copying a reply copies the answer only."""

from __future__ import annotations

import pytest

from radixchat.chat.remote import RemoteBackend
from radixchat.chat.session import SessionFile, SessionMessage
from radixchat.chat.usage import footer_from_meta
from radixchat.tui.app import RadixChatApp
from radixchat.tui.widgets.thinking import ThinkingBlock
from tests.remote.fake_server import FakeServer, Stream
from tests.tui.conftest import TERMINAL, ready, say, wait_until

USAGE = {"prompt_tokens": 20, "completion_tokens": 12, "completion_tokens_details": {"reasoning_tokens": 8}}
NARROW = (80, 28)


@pytest.fixture
def server():
    s = FakeServer().start()
    s.default = Stream(
        reasoning=["The user ", "greets me. ", "I should ", "greet back ", "and offer help."],
        deltas=["Hello", " there! ", "How can I **help**?"],
        usage=USAGE,
    )
    yield s
    s.stop()


def app_on(server: FakeServer, settings) -> RadixChatApp:
    backend = RemoteBackend(server.url, "fake-model", timeout_s=5.0, retries=0)
    return RadixChatApp(
        settings, backend_factory=lambda s, p: backend, panel_interval=None, session="thinking"
    )


def blocks(app) -> list[ThinkingBlock]:
    return list(app.query(ThinkingBlock))


async def test_thinking_streams_folded_above_the_answer_and_f6_shows_it(server, settings):
    server.default.delay_each = 0.05
    app = app_on(server, settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "Hi", wait=False)
        await wait_until(lambda: blocks(app) and blocks(app)[0].streaming, pilot=pilot)
        assert blocks(app)[0].title.startswith("Thinking… ") and blocks(app)[0].collapsed
        await wait_until(lambda: app.chat.turns_finished == 1, pilot=pilot)
        view = app.chat.transcript.last_assistant()
        (block,) = view.query(ThinkingBlock)
        assert block.title == "Thought for 8 tokens" and block.collapsed
        assert block.text == "The user greets me. I should greet back and offer help."
        assert view.children.index(block) < view.children.index(view.body)  # above the answer
        footer = str(view.query_one(".footer").render())
        assert "thinking 8 · answer 4" in footer

        await pilot.press("f6")
        assert not block.collapsed
        await say(app, pilot, "Again")  # a block mounted while thinking is shown comes unfolded
        assert [b.collapsed for b in blocks(app)] == [False, False]
        await pilot.press("f6")
        assert [b.collapsed for b in blocks(app)] == [True, True]

        app.chat.action_copy_last()
        assert app.clipboard == "Hello there! How can I **help**?"


async def prepare(pilot, show: bool) -> None:
    app = pilot.app
    await ready(app, pilot)
    await say(app, pilot, "Hi")
    view = app.chat.transcript.last_assistant()
    view.message.meta.update(ttft_ms=95.0, decode_tokens_per_s=31.0)  # measured: fixed for the picture
    view.set_footer(footer_from_meta(view.message.meta, view.message.finish_reason))
    if show:
        await pilot.press("f6")
        app.clear_notifications()  # "Thinking shown" would leave after 1.5 s: not in the picture
    app.chat.prompt.cursor_blink = False
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


def test_a_reply_with_its_thinking_folded(snap_compare, server, settings):
    async def run_before(pilot):
        await prepare(pilot, show=False)

    assert snap_compare(app_on(server, settings), terminal_size=NARROW, run_before=run_before)


def test_a_reply_with_its_thinking_shown(snap_compare, server, settings):
    async def run_before(pilot):
        await prepare(pilot, show=True)

    assert snap_compare(app_on(server, settings), terminal_size=NARROW, run_before=run_before)


async def test_a_reopened_session_shows_its_thinking_folded(server, settings):
    saved = SessionFile(
        name="old",
        model="fake-model",
        messages=[
            SessionMessage(role="user", content="Hi"),
            SessionMessage(
                role="assistant",
                content="Hello!",
                reasoning="They greet me.",
                meta={"usage": {"completion_tokens": 9, "reasoning_tokens": 7}},
            ),
        ],
    )
    backend = RemoteBackend(server.url, "fake-model", timeout_s=5.0, retries=0)
    app = RadixChatApp(settings, session=saved, backend_factory=lambda s, p: backend, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: blocks(app), pilot=pilot)
        (block,) = blocks(app)
        assert block.collapsed and block.title == "Thought for 7 tokens" and block.text == "They greet me."
        view = app.chat.transcript.last_assistant()
        assert "thinking 7 · answer 2" in str(view.query_one(".footer").render())
        await pilot.press("f6")
        assert not block.collapsed
