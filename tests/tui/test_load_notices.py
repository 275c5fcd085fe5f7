"""What the backend decided for the user at load time (a chat template chosen for a model that ships none)
is said once the chat is up, as a notification."""

from __future__ import annotations

from tests.tui.conftest import TERMINAL, ready, wait_until

NOTICE = "the model ships no chat template: using the built-in 'gemma' template (its tokenizer has <start_of_turn>)"


async def test_a_backends_load_notice_is_shown_once_the_chat_is_up(make_app, fake):
    fake.notices = (NOTICE,)
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: any(str(n.message) == NOTICE for n in app._notifications), pilot=pilot)
        titles = [n.title for n in app._notifications if str(n.message) == NOTICE]
        assert titles == ["Chat template"]


async def test_no_notice_when_the_backend_decided_nothing(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await pilot.pause()
        assert not [n for n in app._notifications if n.title == "Chat template"]
