"""A remote backend (an OpenAI-compatible server) in the app: usage the server may not report, a stream
that breaks mid-reply, and panels fed from ``backend.totals`` instead of engine stats."""

from __future__ import annotations

from radixchat.chat.session import SessionFile
from radixchat.chat.usage import footer_from_meta
from radixchat.tui.state import ChatState
from radixchat.tui.widgets.cache_tree import CacheTree
from tests.tui.conftest import TERMINAL, FakeRemoteBackend, ready, say


def text_of(app, selector: str) -> str:
    return str(app.query_one(selector).render())


async def test_a_reply_without_usage_has_a_footer_without_counts(make_app):
    remote = FakeRemoteBackend()  # llama.cpp streams no usage at all
    app = make_app(backend=remote)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hello")
        assert (
            str(app.chat.transcript.last_assistant().query_one(".footer").render()) == "TTFT 80 ms · 25 tok/s"
        )
        assert list(app.chat.state.hit_history) == [] and app.chat.state.last_hit is None
        remote.usage = (120, None)  # prompt tokens reported, cached tokens not
        await say(app, pilot, "again")
        assert str(app.chat.transcript.last_assistant().query_one(".footer").render()) == (
            "prompt 120 · TTFT 80 ms · 25 tok/s"
        )


async def test_the_panels_show_the_servers_totals_and_say_what_is_not_local(make_app):
    remote = FakeRemoteBackend()
    app = make_app(backend=remote)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "one")  # no cache report
        await app.chat.refresh_panels_now()
        assert "the server reports no cached tokens" in text_of(app, "#hit-rate .numbers")
        remote.usage = (200, 150)
        await say(app, pilot, "two")
        remote.usage = (100, 100)
        await say(app, pilot, "three")
        await app.chat.refresh_panels_now()
        await pilot.pause()
        hit = text_of(app, "#hit-rate .numbers")
        assert "overall     83%" in hit and "last turn  100%" in hit  # 250 of 300 over the reported turns
        assert "250 of 300 prompt tokens reused" in hit
        assert list(app.chat.state.hit_history) == [0.75, 1.0]
        assert not app.query_one(CacheTree).display
        assert text_of(app, "#tree-note") == remote.cache_tree_note
        assert "Nothing local to show" in text_of(app, "#memory") and remote.base_url in text_of(
            app, "#memory"
        )
        speed = text_of(app, "#speed")
        assert "TTFT    80 ms" in speed and "25.0 tok/s" in speed and "replies 3" in speed
        assert "served-model" in speed


async def test_a_reply_cut_off_mid_stream_keeps_its_text_and_says_why(make_app, settings):
    remote = FakeRemoteBackend()
    app = make_app(backend=remote, session="cut")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        remote.break_after = 6
        await say(app, pilot, "tell me")
        view = app.chat.transcript.last_assistant()
        msg = app.chat.state.conv.messages[-1]
        assert msg.content == "You sa" and msg.finish_reason == "error" and msg.meta["partial"]
        shown = str(view.query_one(".footer").render())
        assert shown.startswith("▲ cut off · TTFT 80 ms") and "closed the connection mid-reply" in shown
        assert view.has_class("-error")
        assert any("mid-reply" in str(n.message) for n in app._notifications)
        # the same footer after reopening (from the saved meta)
        assert footer_from_meta(msg.meta, msg.finish_reason) == shown


def test_footer_from_meta_treats_missing_counts_as_unknown():
    meta = {"usage": {"prompt_tokens": 10, "completion_tokens": 3}, "ttft_ms": 5.0}
    assert footer_from_meta(meta, "stop") == "prompt 10 · TTFT 5 ms"
    assert footer_from_meta({"usage": {"completion_tokens": 3}}, "stop") == ""
    both = {"usage": {"prompt_tokens": 10, "cached_tokens": 4}}
    assert footer_from_meta(both, "stop") == "reused 4 · prefilled 6"


def test_record_turn_takes_unreported_counts():
    state = ChatState()
    state.record_turn(None, None, 50.0, 20.0)
    state.record_turn(100, None)
    state.record_turn(0, 0)
    assert list(state.hit_history) == [] and state.last_hit is None
    state.record_turn(100, 40)
    assert list(state.hit_history) == [0.4] and state.last_hit == 0.4


def test_opening_a_session_does_not_carry_lenient_json_mode_over():
    """Lenient JSON mode is agreed for one schema: a session opened next (with its own schema) asks again,
    and its tool permissions start empty."""
    state = ChatState()
    state.lenient, state.allowed_tools = True, {"shout"}
    schema = {"type": "array", "uniqueItems": True}
    state.adopt(SessionFile(name="other", model="m", mode="json", schema=schema))
    assert state.lenient is False and not state.allowed_tools
    assert state.mode == "json" and state.schema == schema
