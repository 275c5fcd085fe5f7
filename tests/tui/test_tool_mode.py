"""Tool mode through the UI: calls run and show as blocks, user tools ask first, the tools screen, stop."""

from __future__ import annotations

import asyncio
import sys

import pytest

import radixchat.tui.screens.consent as consent_screen
from radixchat.chat.session import load_session, session_path
from radixchat.config import UserToolConfig
from radixchat.tool_format import CallFilter, strip_tool_calls
from radixchat.tui.screens.consent import ConsentScreen
from radixchat.tui.screens.tools import ToolsScreen
from radixchat.tui.widgets.assistant_message import AssistantMessage
from radixchat.tui.widgets.tool_call import ToolCallBlock
from tests.tui.conftest import (
    TERMINAL,
    FakeBackend,
    Script,
    ToolFakeBackend,
    call_then_answer,
    ready,
    say,
    tool_call_text,
    turn_done,
    wait_until,
)

SHOUT = """\
import json, sys
args = json.load(sys.stdin)
print(args["text"].upper())
"""


@pytest.fixture(autouse=True)
def quick_consent(monkeypatch):
    monkeypatch.setattr(consent_screen, "ARM_DELAY", 0.05)


@pytest.fixture
def shout_settings(settings, tmp_path):
    """Settings declaring one user tool: a tiny Python script run with this interpreter."""
    script = tmp_path / "shout.py"
    script.write_text(SHOUT)
    tool = {
        "name": "shout",
        "description": "Say it louder.",
        "command": [sys.executable, str(script)],
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    }
    return settings.model_copy(update={"tools": [UserToolConfig(**tool)]})


def block_title(block: ToolCallBlock) -> str:
    return str(block.title)


async def in_tool_mode(app, pilot) -> None:
    await ready(app, pilot)
    await app.chat.action_set_mode("tool")
    assert app.chat.mode_problem is None


async def answer_consent(app, pilot, key: str) -> str:
    """Wait for the consent dialog, press ``key``; returns what the dialog said."""
    await wait_until(lambda: isinstance(app.screen, ConsentScreen) and app.screen.armed, pilot=pilot)
    said = app.screen.query_one("Markdown").source
    await pilot.press(key)
    return said


async def test_a_tool_call_runs_shows_as_a_block_and_the_answer_streams_after_it(make_app, settings):
    fake = ToolFakeBackend(call_then_answer("calculator", {"expression": "6*7"}))
    app = make_app(backend=fake, session="calc")
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        await say(app, pilot, "What is 6*7?")
        conv = app.chat.state.conv
        assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
        assert conv.messages[1].tool_calls == [{"name": "calculator", "arguments": {"expression": "6*7"}}]
        assert conv.messages[2].content == "42" and conv.messages[2].meta["error"] is False
        call_view, answer = app.chat.transcript.query(AssistantMessage)
        (block,) = call_view.calls
        assert block_title(block).startswith('✓ calculator(expression="6*7") → 42 · ')
        assert block_title(block).endswith(" ms") and block.has_class("-ok") and block.collapsed
        assert "<tool_call>" not in call_view.body.source and not call_view.body.display
        assert answer.body.source == "The tool said: 42" and not answer.calls
        footer = str(answer.query_one(".footer").render())
        assert footer.startswith("reused ") and footer.endswith("TTFT 12 ms · 42 tok/s")
        # the call round is a constrained reply with the offered tools; so is the round after it
        assert [c[0] for c in fake.constraints][-2:] == ["tool", "tool"]
        assert "calculator" in fake.constraints[-1][1] and fake.constraints[-2][2] == "auto"
        # expanding the block shows the arguments and the result
        block.collapsed = False
        await pilot.pause()
        details = block.query_one(".call-details").source
        assert '"expression": "6*7"' in details and "*result*" in details and "42" in details
        saved = load_session(session_path(settings.sessions_dir, "calc"))
        assert [m.role for m in saved.messages] == ["user", "assistant", "tool", "assistant"]
        assert saved.messages[2].meta["duration_ms"] >= 0 and saved.mode == "tool"


async def test_a_reopened_tool_turn_shows_the_same_blocks(make_app, settings):
    fake = ToolFakeBackend(call_then_answer("calculator", {"expression": "1/0"}))
    app = make_app(backend=fake, session="div")
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        await say(app, pilot, "Divide by zero")
        live = [block_title(b) for b in app.query(ToolCallBlock)]
    assert live and live[0].startswith('✗ calculator(expression="1/0") → error: division by zero')
    app2 = make_app(backend=FakeBackend(), session=load_session(session_path(settings.sessions_dir, "div")))
    async with app2.run_test(size=TERMINAL) as pilot:
        await ready(app2, pilot)
        assert [block_title(b) for b in app2.query(ToolCallBlock)] == live
        assert app2.query_one(ToolCallBlock).has_class("-error")
        assert (
            app2.chat.state.mode == "tool" and app2.chat.state.conv.tools
        )  # continues with the same declarations


async def test_denying_a_user_tool_gives_the_model_an_error_and_it_goes_on(make_app, shout_settings):
    fake = ToolFakeBackend(call_then_answer("shout", {"text": "hi"}))
    app = make_app(backend=fake, settings=shout_settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        app.chat.state.tool_names = ["calculator", "shout"]
        done = app.chat.turns_finished
        await say(app, pilot, "shout hi", wait=False)
        said = await answer_consent(app, pilot, "n")
        assert "Say it louder." in said and "shout.py" in said and '"text": "hi"' in said
        await turn_done(app, pilot, done)
        block = app.query_one(ToolCallBlock)
        assert block.has_class("-error") and "the user did not allow this call" in block_title(block)
        assert app.chat.transcript.last_assistant().message.content == (
            "The tool said: error: the user did not allow this call"
        )


async def test_allow_once_runs_the_tool_and_asks_again_next_time(make_app, shout_settings):
    fake = ToolFakeBackend(call_then_answer("shout", {"text": "hi"}))
    app = make_app(backend=fake, settings=shout_settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        app.chat.state.tool_names = ["shout"]
        done = app.chat.turns_finished
        await say(app, pilot, "shout hi", wait=False)
        await answer_consent(app, pilot, "y")
        await turn_done(app, pilot, done)
        assert app.query_one(ToolCallBlock).result == "HI"
        assert app.chat.transcript.last_assistant().message.content == "The tool said: HI"
        await say(app, pilot, "again", wait=False)
        await answer_consent(app, pilot, "escape")  # asked again: once was once; Esc denies
        await turn_done(app, pilot, done + 1)
        assert list(app.query(ToolCallBlock))[-1].error == "the user did not allow this call"


async def test_always_allow_stops_asking_for_that_tool_in_this_session(make_app, shout_settings):
    fake = ToolFakeBackend(call_then_answer("shout", {"text": "hey"}))
    app = make_app(backend=fake, settings=shout_settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        app.chat.state.tool_names = ["shout"]
        await say(app, pilot, "one", wait=False)
        await answer_consent(app, pilot, "a")
        await turn_done(app, pilot, 0)
        await say(app, pilot, "two")  # no dialog this time
        assert [b.result for b in app.query(ToolCallBlock)] == ["HEY", "HEY"]
        await app.chat.action_new_chat()  # a new session asks again
        done = app.chat.turns_finished
        await say(app, pilot, "three", wait=False)
        await answer_consent(app, pilot, "n")
        await turn_done(app, pilot, done)


async def test_the_consent_dialog_ignores_allow_keys_until_it_is_armed(make_app, shout_settings, monkeypatch):
    monkeypatch.setattr(consent_screen, "ARM_DELAY", 30)
    fake = ToolFakeBackend(call_then_answer("shout", {"text": "x"}))
    app = make_app(backend=fake, settings=shout_settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        app.chat.state.tool_names = ["shout"]
        await say(app, pilot, "go", wait=False)
        await wait_until(lambda: isinstance(app.screen, ConsentScreen), pilot=pilot)
        await pilot.press("y", "a")  # typed for the prompt: neither allows
        assert isinstance(app.screen, ConsentScreen) and not app.screen.armed
        assert app.focused is app.screen.query_one("#deny")
        await pilot.press("enter")  # the focused answer is Deny, which always works
        await turn_done(app, pilot, 0)
        assert app.query_one(ToolCallBlock).error == "the user did not allow this call"


async def test_the_tools_screen_chooses_the_offered_tools_and_tool_choice(make_app, settings):
    fake = ToolFakeBackend(call_then_answer("calculator", {"expression": "2+2"}))
    app = make_app(backend=fake, session="picked")
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        await pilot.press("f4")
        await wait_until(lambda: isinstance(app.screen, ToolsScreen), pilot=pilot)
        screen = app.screen
        assert "Evaluate an arithmetic expression" in screen.query_one("#tools-doc").source
        await pilot.press("down", "space")  # 'now' is no longer offered
        screen.query_one("Select").value = "call:now"
        await pilot.press("ctrl+s")
        assert "not offered" in str(screen.query_one("#tools-error").render())
        screen.query_one("Select").value = "call:calculator"
        await pilot.press("ctrl+s")
        await wait_until(lambda: not isinstance(app.screen, ToolsScreen), pilot=pilot)
        assert app.chat.state.tool_names == ["calculator", "read_session_notes", "write_session_notes"]
        assert app.chat.state.tool_choice == {"name": "calculator"}
        assert "tool_choice calculator" in str(app.query_one("StatusBar .activity").render())
        await say(app, pilot, "2+2?")
        mode, names, choice = fake.constraints[-2]  # the first round of the turn
        assert names == ["calculator", "read_session_notes", "write_session_notes"]
        assert choice == {"name": "calculator"}
        saved = load_session(session_path(settings.sessions_dir, "picked"))
        assert saved.tools == ["calculator", "read_session_notes", "write_session_notes"]
        assert saved.tool_choice == {"name": "calculator"}  # docs/tui.md: saved with the session


async def test_escape_stops_a_tool_turn_and_keeps_what_was_done(make_app):
    def plan(conv) -> str:
        if conv.messages[-1].role == "tool":
            return "A long answer. " * 20  # two chunks: the second waits for a gate that never opens
        return tool_call_text("calculator", {"expression": "2**10"})  # one chunk: never waits

    fake = ToolFakeBackend(plan, Script(chunk=200, gate=asyncio.Event()))
    app = make_app(backend=fake)
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        await say(app, pilot, "go", wait=False)
        await wait_until(
            lambda: len(app.query(AssistantMessage)) == 2 and app.chat.transcript.last_assistant().streamed,
            pilot=pilot,
        )
        await pilot.press("escape")
        await turn_done(app, pilot, 0)
        assert app.query_one(ToolCallBlock).result == "1024"
        last = app.chat.state.conv.messages[-1]
        assert last.finish_reason == "cancelled" and last.content == ("A long answer. " * 20)[:200]
        assert str(app.chat.transcript.last_assistant().query_one(".footer").render()).startswith("■ stopped")
        assert app.chat.in_flight is None and "generating" not in str(
            app.query_one("StatusBar .activity").render()
        )


async def test_regenerate_in_tool_mode_runs_the_whole_turn_again_as_a_branch(make_app):
    fake = ToolFakeBackend(call_then_answer("calculator", {"expression": "3*3"}))
    app = make_app(backend=fake)
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        await say(app, pilot, "3*3?")
        await pilot.press("ctrl+r")
        await turn_done(app, pilot, 1)
        assert len(app.chat.state.branches) == 2
        for branch in app.chat.state.branches:
            assert [m.role for m in branch.conv.messages] == ["user", "assistant", "tool", "assistant"]
        assert len(app.query(ToolCallBlock)) == 1  # the transcript shows the new branch only
        # the rerun's first round was served from the cache: everything but the prompt's last token
        first_round = app.chat.state.conv.messages[1].meta["usage"]
        assert first_round["cached_tokens"] == first_round["prompt_tokens"] - 1


async def test_session_notes_tools_keep_their_notes_in_the_session(make_app, settings):
    fake = ToolFakeBackend(call_then_answer("write_session_notes", {"text": "buy milk"}))
    app = make_app(backend=fake, session="notes")
    async with app.run_test(size=TERMINAL) as pilot:
        await in_tool_mode(app, pilot)
        await say(app, pilot, "remember to buy milk")
        assert app.chat.state.tool_ctx.notes == "buy milk"
    assert load_session(session_path(settings.sessions_dir, "notes")).notes == "buy milk"


def test_the_call_filter_holds_call_blocks_out_of_streamed_text():
    f = CallFilter()
    text = 'Let me check.<tool_call>\n{"name": "x"}\n</tool_call> Done <tool'
    shown = "".join(f.feed(text[i : i + 3]) for i in range(0, len(text), 3)) + f.flush()
    assert shown == "Let me check. Done <tool" and f.calls == 1
    assert strip_tool_calls(tool_call_text("x", {}) + "\n\nok") == "ok"


async def test_a_user_tool_clashing_with_a_built_in_is_reported_and_the_built_ins_stay(make_app, settings):
    clash = UserToolConfig(name="calculator", command=["true"])
    app = make_app(settings=settings.model_copy(update={"tools": [clash]}))
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert any("clashes with a built-in tool" in str(n.message) for n in app._notifications)
        assert (
            all(t.builtin for t in app.chat.registry.tools.values())
            and "calculator" in app.chat.registry.tools
        )
