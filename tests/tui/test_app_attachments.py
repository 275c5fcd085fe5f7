"""Attaching files in the chat app: @path in the prompt, the bar with each file's tokens, Tab completion,
the F8 picker, and what is refused (fake backend: one token a character)."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixchat.chat.attachments import Attachment, compose_message
from radixchat.tui.screens.attach import AttachScreen
from radixchat.tui.widgets.attachment_bar import AttachmentBar
from tests.tui.conftest import TERMINAL, ready, say, wait_until


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory @paths start from, with a code file in it."""
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "add.py").write_text("def add(a, b):\n    return a + b\n")
    monkeypatch.chdir(folder)
    return folder


def bar_text(app) -> str:
    return str(app.chat.query_one(AttachmentBar).render())


async def test_a_mentioned_file_goes_into_the_message_before_the_text(make_app, fake, workdir):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "What does @add.py do?")
        expected = compose_message(
            "What does @add.py do?",
            [Attachment("add.py", "def add(a, b):\n    return a + b\n", language="python")],
        )
        assert fake.script.replies[-1] == expected
        assert app.chat.prompt.text == ""
        assert app.chat.prompt.prompts.items[-1] == "What does @add.py do?"  # history keeps what was typed


async def test_the_bar_shows_each_attachment_and_its_tokens_before_sending(make_app, fake, workdir):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        bar = app.chat.query_one(AttachmentBar)
        assert not bar.display
        app.chat.prompt.load_text("Explain @add.py please")
        await wait_until(lambda: bar.items, pilot=pilot)
        block = Attachment("add.py", "def add(a, b):\n    return a + b\n", language="python").block()
        assert bar.display and bar_text(app) == f"Attached: add.py ({fake.count_tokens(block):,} tokens)"
        app.chat.prompt.load_text("no file now")
        await wait_until(lambda: not bar.items, pilot=pilot)
        assert not bar.display


async def test_a_binary_file_is_refused_and_the_message_kept(make_app, fake, workdir):
    (workdir / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.prompt.load_text("Describe @logo.png")
        await wait_until(lambda: app.chat.query_one(AttachmentBar).items, pilot=pilot)
        assert bar_text(app).startswith("Cannot send: cannot attach logo.png: a binary file")
        await pilot.press("enter")
        await pilot.pause()
        assert fake.script.replies == []
        assert app.chat.prompt.text == "Describe @logo.png"
        notes = [str(n.message) for n in app._notifications]
        assert any(n.startswith("cannot attach logo.png: a binary file") for n in notes)


async def test_what_would_not_fit_the_context_is_refused(make_app, fake, workdir):
    (workdir / "big.txt").write_text("word " * 1000)  # 5,000 tokens: the fake's context is 4,096
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.prompt.load_text("Summarise @big.txt")
        await wait_until(lambda: app.chat.query_one(AttachmentBar).items, pilot=pilot)
        assert "more than the model's context of 4,096" in bar_text(app)
        await pilot.press("enter")
        await pilot.pause()
        assert fake.script.replies == [] and app.chat.prompt.text == "Summarise @big.txt"
        notes = [str(n.message) for n in app._notifications]
        assert any("does not fit the model's context of 4,096 tokens" in n for n in notes)
        assert not [m for m in app.chat.state.conv.messages if m.role == "user"]  # nothing was added


async def test_tab_completes_an_at_path_and_otherwise_moves_the_focus(make_app, workdir):
    (workdir / "src").mkdir()
    (workdir / "src" / "main.py").write_text("x = 1\n")
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        prompt = app.chat.prompt
        prompt.load_text("look at @sr")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("tab")
        assert prompt.text == "look at @src/"
        await pilot.press("m", "tab")
        assert prompt.text == "look at @src/main.py"
        prompt.load_text("plain words")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("tab")
        assert app.focused is not prompt


async def test_f8_picks_a_file_into_the_prompt(make_app, fake, workdir):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.prompt.load_text("Explain")
        app.chat.prompt.move_cursor(app.chat.prompt.document.end)
        await pilot.press("f8")
        await wait_until(lambda: isinstance(app.screen, AttachScreen), pilot=pilot)
        app.screen.dismiss(workdir / "add.py")  # as Enter on the file in the tree does
        await wait_until(lambda: app.chat.prompt.text == "Explain @add.py ", pilot=pilot)
        assert app.focused is app.chat.prompt


async def test_escape_closes_the_picker_and_changes_nothing(make_app, workdir):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await app.run_action("attach_file", app.chat)  # as the palette's "Attach file…" does
        await wait_until(lambda: isinstance(app.screen, AttachScreen), pilot=pilot)
        await pilot.press("escape")
        await wait_until(lambda: not isinstance(app.screen, AttachScreen), pilot=pilot)
        assert app.chat.prompt.text == ""
