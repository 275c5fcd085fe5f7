"""Saved sessions' KV through the app (over the fake backend's in-memory store): each save stores the
active branch's tokens after the file, opening a session loads them before the background prefill, the
browser shows which sessions are warm and deletes or renames their KV with them, and a store that cannot
be written costs a warning, never the session. The real engine's side: tests/chat/test_saved_kv.py."""

from __future__ import annotations

from radixchat.chat.backend import kv_owner
from radixchat.chat.session import load_session, session_path
from radixchat.tui.screens.dialogs import ConfirmDialog, NameDialog
from radixchat.tui.screens.sessions import SessionsScreen
from tests.tui.conftest import TERMINAL, FakeBackend, FakeRemoteBackend, ready, say, wait_until


def messages(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_each_save_stores_the_active_branchs_kv_after_the_file(make_app, settings):
    fake = FakeBackend(kv={})
    app = make_app(backend=fake, session="trip")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "plan a trip")
        await say(app, pilot, "to Lisbon")
        owner = kv_owner(session_path(settings.sessions_dir, "trip"))
        await wait_until(lambda: fake.kv.get(owner) == app.chat.state.conv.ids, pilot=pilot)
        assert list(fake.kv) == [owner]
        assert not [n for n in app._notifications if n.severity != "information"]


async def test_an_opened_session_loads_its_kv_before_prefilling_the_rest(make_app, settings):
    store: dict[str, list[int]] = {}
    first = FakeBackend(kv=store)
    app = make_app(backend=first, session="trip")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "plan a trip")
        ids = app.chat.state.conv.ids
    second = FakeBackend(kv=store)  # a new process over the same disk
    app2 = make_app(backend=second, session=load_session(session_path(settings.sessions_dir, "trip")))
    async with app2.run_test(size=TERMINAL) as pilot:
        await ready(app2, pilot)
        await wait_until(lambda: second.warmed == [ids], pilot=pilot)
        assert second.loads == [len(ids)]  # load_kv came first, so the prefill has nothing left
        await wait_until(lambda: any("from disk" in m for m in messages(app2)), pilot=pilot)
        assert f"Loaded {len(ids)} tokens of history from disk" in messages(app2)
        await say(app2, pilot, "and back")
        assert app2.chat.state.conv.messages[-1].meta["usage"]["cached_tokens"] == len(ids)


async def test_a_full_kv_store_warns_once_and_keeps_every_session_save(make_app, settings):
    fake = FakeBackend(kv={})
    fake.kv_full = True
    app = make_app(backend=fake, session="notes")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "one")
        await say(app, pilot, "two")
        path = session_path(settings.sessions_dir, "notes")
        await wait_until(lambda: path.exists() and len(load_session(path).messages) == 4, pilot=pilot)
        warnings = [n for n in app._notifications if "No space left" in str(n.message)]
        assert len(warnings) == 1 and warnings[0].severity == "warning"  # a notice, not an error
        assert not any("Save failed" in (n.title or "") for n in app._notifications)
        assert fake.kv == {}


async def test_the_browser_shows_warm_sessions_and_deletes_and_renames_their_kv(make_app, settings):
    fake = FakeBackend(kv={})
    app = make_app(backend=fake, session="alpha")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "first")
        await pilot.press("ctrl+n")
        app.chat.state.session_name = "beta"
        await say(app, pilot, "second")
        alpha = kv_owner(session_path(settings.sessions_dir, "alpha"))
        beta = kv_owner(session_path(settings.sessions_dir, "beta"))
        await wait_until(lambda: set(fake.kv) == {alpha, beta}, pilot=pilot)
        fake.kv.pop(beta)  # as if the budget had let it go: beta is cold now
        await pilot.press("ctrl+o")
        await wait_until(
            lambda: isinstance(app.screen, SessionsScreen) and len(app.screen.entries) == 2, pilot=pilot
        )
        screen = app.screen
        table = screen.query_one("DataTable")
        rows = {table.get_row_at(i)[0].rstrip(" ●"): table.get_row_at(i) for i in range(table.row_count)}
        kb = len(fake.kv[alpha]) * 1000 / 1024
        assert rows["alpha"][4] == f"warm · {kb:.1f} KiB" and rows["beta"][4] == ""

        table.move_cursor(row=[e.name for e in screen.entries].index("alpha"))
        await pilot.press("r")
        await wait_until(lambda: isinstance(app.screen, NameDialog), pilot=pilot)
        app.screen.query_one("Input").value = "gamma"
        await pilot.press("enter")
        gamma = kv_owner(session_path(settings.sessions_dir, "gamma"))
        await wait_until(lambda: gamma in fake.kv and alpha not in fake.kv, pilot=pilot)

        await wait_until(lambda: "gamma" in [e.name for e in screen.entries], pilot=pilot)
        table.move_cursor(row=[e.name for e in screen.entries].index("gamma"))
        await pilot.press("d")
        await wait_until(lambda: isinstance(app.screen, ConfirmDialog), pilot=pilot)
        await pilot.press("y")
        await wait_until(lambda: fake.kv == {}, pilot=pilot)
        assert not session_path(settings.sessions_dir, "gamma").exists()


async def test_a_backend_without_a_store_has_no_kv_column(make_app, settings):
    app = make_app(backend=FakeRemoteBackend())
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "hi")
        await pilot.press("ctrl+o")
        await wait_until(
            lambda: isinstance(app.screen, SessionsScreen) and len(app.screen.entries) == 1, pilot=pilot
        )
        assert len(app.screen.query_one("DataTable").columns) == 4
