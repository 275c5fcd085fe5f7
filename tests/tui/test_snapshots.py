"""Snapshots of the app at fixed terminal sizes (fake backend, no timers, fixed names and times).

Update after an intended visual change with ``pytest tests/tui/test_snapshots.py --snapshot-update`` and
look at the SVGs in ``__snapshots__/`` before committing them.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

import radixchat.tui.chat_core as chat_core
from radixchat.chat.backend import kv_owner
from radixchat.chat.modes import ModeError
from radixchat.chat.session import SessionFile, atomic_write_text, session_path
from radixchat.config import Settings
from radixchat.tui.app import RadixChatApp
from tests.tui.conftest import (
    FakeBackend,
    Script,
    ToolFakeBackend,
    ready,
    say,
    tool_call_text,
    turn_done,
    wait_until,
)

WIDE, NARROW = (130, 40), (80, 28)

CODE = """Here is one way:

```python
def add(a: int, b: int) -> int:
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b
```

Call it as `add(2, 3)`."""


def replies() -> Script:
    """The code reply, then alternating thank-you answers (so a regenerated reply differs)."""
    thanks: list[str] = []

    def reply_for(prompt: str) -> str:
        if "add" in prompt:
            return CODE
        thanks.append(prompt)
        return "You're welcome!" if len(thanks) % 2 else "Any time — happy coding."

    return Script(reply_for=reply_for)


def app_for(
    settings, script: Script | None = None, backend: FakeBackend | None = None, **kwargs
) -> RadixChatApp:
    fake = backend or FakeBackend(script or replies())
    kwargs.setdefault("session", "demo")  # a fixed name: autosave would otherwise put the time in view
    return RadixChatApp(settings, backend_factory=lambda s, p: fake, panel_interval=None, **kwargs)


def tool_plan(conv) -> str:
    """Two calls in one round (arithmetic, then a note), then an answer that uses the results."""
    last = conv.messages[-1]
    if last.role == "user":
        return (
            tool_call_text("calculator", {"expression": "2340 * 0.17"})
            + "\n"
            + tool_call_text("write_session_notes", {"text": "17% of 2,340 = 397.8", "mode": "append"})
        )
    return "17% of 2,340 is **397.8**. I added it to this session's notes."


def tool_app(settings) -> RadixChatApp:
    return app_for(settings, backend=ToolFakeBackend(tool_plan), session="budget")


async def tool_turn(pilot) -> None:
    """One tool turn; timings fixed (they are measured), the first call expanded."""
    app = pilot.app
    await ready(app, pilot)
    await app.chat.action_set_mode("tool")
    await say(app, pilot, "What is 17% of 2,340? Note it down.")
    blocks = list(app.query("ToolCallBlock"))
    for block in blocks:
        block.set_outcome(block.result, block.error, 0.4)
    blocks[0].collapsed = False
    await app.chat.refresh_panels_now()
    await settle(pilot)


async def two_turns(pilot) -> None:
    app = pilot.app
    await ready(app, pilot)
    await say(app, pilot, "Write an add function in Python")
    await say(app, pilot, "Thanks!")
    done = app.chat.turns_finished
    await pilot.press("ctrl+r")  # a second branch: the cache tree forks after the shared prefix
    await turn_done(app, pilot, done)
    await app.chat.refresh_panels_now()
    await settle(pilot)


async def settle(pilot) -> None:
    """Let layout and the transcript's scroll-to-bottom finish before the screenshot, with the prompt's
    cursor steady (it blinks every 0.5 s: a slow run would catch it off)."""
    pilot.app.chat.prompt.cursor_blink = False
    t = pilot.app.chat.transcript
    seen: list[float] = []

    def still() -> bool:  # the scroll offset held for three polls (short content sits below 0: anchored)
        seen.append(t.scroll_y)
        return len(seen) >= 3 and seen[-1] == seen[-2] == seen[-3]

    await pilot.wait_for_scheduled_animations()
    await wait_until(still, pilot=pilot)


def test_chat_with_live_panels(snap_compare, settings):
    assert snap_compare(app_for(settings), terminal_size=WIDE, run_before=two_turns)


def test_narrow_terminal_hides_the_panels(snap_compare, settings):
    assert snap_compare(app_for(settings), terminal_size=NARROW, run_before=two_turns)


def test_a_tool_turn_with_its_call_blocks(snap_compare, settings):
    assert snap_compare(tool_app(settings), terminal_size=WIDE, run_before=tool_turn)


def test_help_screen(snap_compare, settings):
    async def run_before(pilot) -> None:
        await ready(pilot.app, pilot)
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app_for(settings), terminal_size=WIDE, run_before=run_before)


def test_a_stopped_reply_and_an_unavailable_mode(snap_compare, settings, monkeypatch):
    def unavailable(backend, spec):
        if spec.mode == "chat":
            return None
        raise ModeError(f"{spec.mode} mode is not available with this backend")

    monkeypatch.setattr(chat_core, "grammar_for", unavailable)  # the message is the grammar layer's
    script = Script(reply_for=lambda p: "This reply is long " * 20, chunk=5, gate=asyncio.Event())

    async def run_before(pilot) -> None:
        app = pilot.app
        await ready(app, pilot)
        await say(app, pilot, "Tell me a long story", wait=False)
        await wait_until(
            lambda: app.chat.reply_view is not None and app.chat.reply_view.streamed, pilot=pilot
        )
        await pilot.press("escape")
        await turn_done(app, pilot, 0)
        app.chat.state.mode = "json"
        await app.chat.probe_mode()
        app.chat.update_status()
        await app.chat.refresh_panels_now()
        await settle(pilot)

    assert snap_compare(app_for(settings, script), terminal_size=WIDE, run_before=run_before)


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_session_browser(snap_compare, settings, tui_env, monkeypatch, utc):
    # the browser shows the directory and local times: make both the same on every machine
    monkeypatch.chdir(tui_env)
    settings = settings.model_copy(update={"sessions_dir": Path("sessions")})
    when = datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc)
    for i, name in enumerate(("groceries", "rust-questions", "trip-to-lisbon")):
        s = SessionFile(
            name=name,
            model="fake-model",
            created_at=when,
            updated_at=when.replace(hour=10 + i),
            messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}] * (i + 1),
        )
        atomic_write_text(session_path(settings.sessions_dir, name), s.model_dump_json(by_alias=True))

    async def run_before(pilot) -> None:
        app = pilot.app
        await ready(app, pilot)
        await pilot.press("ctrl+o")
        await wait_until(lambda: len(getattr(app.screen, "entries", [])) == 3, pilot=pilot)
        await pilot.pause()

    # one session is warm: its KV is on disk (1,000 bytes a token in the fake's store)
    warm = {kv_owner(session_path(settings.sessions_dir, "trip-to-lisbon")): list(range(2400))}
    app = app_for(settings, backend=FakeBackend(replies(), kv=warm))
    assert snap_compare(app, terminal_size=WIDE, run_before=run_before)


def test_the_prompt_with_an_attachment_shown(snap_compare, settings, tmp_path, monkeypatch):
    (tmp_path / "add.py").write_text(CODE.split("```python\n")[1].split("```")[0])
    monkeypatch.chdir(tmp_path)

    async def run_before(pilot) -> None:
        app = pilot.app
        await ready(app, pilot)
        app.chat.prompt.load_text("Write tests for @add.py")
        await wait_until(lambda: app.chat.query_one("AttachmentBar").items, pilot=pilot)
        await settle(pilot)

    assert snap_compare(app_for(settings), terminal_size=NARROW, run_before=run_before)


def test_the_session_browser_searching_the_text_of_sessions(
    snap_compare, settings, tui_env, monkeypatch, utc
):
    monkeypatch.chdir(tui_env)
    settings = settings.model_copy(update={"sessions_dir": Path("sessions")})
    when = datetime(2026, 1, 2, 3, 4, tzinfo=timezone.utc)
    texts = {
        "trip-to-lisbon": ("Plan three days in Lisbon", "Start at the castle, then the tram."),
        "soup": ("A recipe for soup", "Boil water. For a Lisbon-style fish stew, add clams."),
        "rust-questions": ("What is a borrow checker?", "It checks borrows at compile time."),
    }
    for i, (name, (question, answer)) in enumerate(texts.items()):
        s = SessionFile(
            name=name,
            model="fake-model",
            created_at=when,
            updated_at=when.replace(hour=10 + i),
            messages=[{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
        )
        atomic_write_text(session_path(settings.sessions_dir, name), s.model_dump_json(by_alias=True))

    async def run_before(pilot) -> None:
        app = pilot.app
        await ready(app, pilot)
        await pilot.press("ctrl+o")
        await wait_until(lambda: len(getattr(app.screen, "entries", [])) == 3, pilot=pilot)
        await pilot.press("slash", *"lisbon")
        await wait_until(lambda: len(app.screen.shown) == 2, pilot=pilot)
        await pilot.pause()

    assert snap_compare(app_for(settings), terminal_size=WIDE, run_before=run_before)


def test_the_settings_screen_with_a_preset_chosen(snap_compare, settings, tui_env):
    config = tui_env / "presets.toml"
    config.write_text(
        '[presets.code]\ndescription = "Terse coding help"\nsystem_prompt = "You write Python. Be terse."\n'
        'temperature = 0.0\ntop_k = 1\n\n[presets.facts]\ndescription = "Answers with the calculator"\n'
        'mode = "tool"\ntools = ["calculator"]\n'
    )
    settings = Settings.load(
        {"sessions_dir": str(tui_env / "sessions"), "model": "fake-model", "max_tokens": "64"},
        config_file=config,
    )

    async def run_before(pilot) -> None:
        from textual.widgets import Select

        from radixchat.tui.screens.settings import SettingsScreen

        app = pilot.app
        await ready(app, pilot)
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), pilot=pilot)
        app.screen.query_one("#preset", Select).value = "code"
        await wait_until(lambda: app.screen.query_one("#f-temperature").value == "0.0", pilot=pilot)
        await pilot.pause()

    assert snap_compare(app_for(settings), terminal_size=WIDE, run_before=run_before)
