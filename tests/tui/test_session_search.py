"""The session browser's search: the text of every saved session, case-insensitive, with a snippet."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable, Input

from radixchat.chat.session import SessionBranch, SessionFile, SessionMessage, save_session, session_path
from radixchat.tui.screens.sessions import SessionsScreen
from radixchat.tui.session_store import SessionEntry, search_sessions, session_text, snippet
from tests.tui.conftest import TERMINAL, ready, wait_until


def save(folder, name: str, *texts: str, branch: str | None = None) -> None:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]
    branches = (
        [SessionBranch(label="edit", messages=[SessionMessage(role="user", content=branch)])]
        if branch
        else []
    )
    save_session(
        SessionFile(name=name, model="fake-model", messages=messages, branches=branches),
        session_path(folder, name),
    )


def test_a_snippet_is_one_line_around_the_first_match_whatever_its_case():
    text = "Day one.\nWe walked up to the Castle of São Jorge and ate pastéis.\nDay two: the beach."
    hit = snippet(text, "castle", width=30)
    assert hit is not None and "Castle" in hit and "\n" not in hit
    assert hit.startswith("…") and hit.endswith("…") and len(hit) <= 32
    assert snippet(text, "museum") is None
    assert snippet("short", "SHORT") == "short"


def entry(name: str, *texts: str, branch: str | None = None) -> SessionEntry:
    session = SessionFile(
        name=name,
        model="m",
        messages=[SessionMessage(role="user", content=t) for t in texts],
        branches=[SessionBranch(label="b", messages=[SessionMessage(role="user", content=branch)])]
        if branch
        else [],
    )
    return SessionEntry(name, Path(f"{name}.json"), text=session_text(session))


def test_search_finds_the_text_of_every_branch_and_the_name():
    entries = [
        entry("trip", "Plan a trip to Lisbon", branch="What about Porto?"),
        entry("porto-notes", "nothing here"),
        entry("cooking", "A recipe for soup"),
    ]
    found = search_sessions(entries, "PORTO")
    assert [(e.name, bool(hit)) for e, hit in found] == [("trip", True), ("porto-notes", False)]


async def open_browser(app, pilot, sessions: int) -> SessionsScreen:
    """The session browser (Ctrl+O), once it lists ``sessions`` sessions."""
    await ready(app, pilot)
    await pilot.press("ctrl+o")
    await wait_until(
        lambda: isinstance(app.screen, SessionsScreen) and len(app.screen.entries) == sessions, pilot=pilot
    )
    return app.screen


async def test_typing_in_the_search_box_lists_the_sessions_that_contain_it(make_app, settings):
    folder = settings.sessions_dir
    save(folder, "trip", "Plan three days in Lisbon", "Start at the castle.")
    save(folder, "soup", "A recipe for soup", "Boil water.", branch="and a LISBON fish stew?")
    save(folder, "rust", "What is a borrow checker?", "It checks borrows.")
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        screen = await open_browser(app, pilot, 3)
        table = screen.query_one(DataTable)
        await pilot.press("slash")
        assert screen.query_one("#sessions-search", Input).has_focus
        await pilot.press(*"lisbon")
        await wait_until(lambda: table.row_count == 2, pilot=pilot)
        rows = {table.get_row_at(i)[0]: table.get_row_at(i)[1] for i in range(table.row_count)}
        assert set(rows) == {"trip", "soup"}
        assert "Lisbon" in rows["trip"] and "LISBON" in rows["soup"]  # the snippet, in the text's own case
        await pilot.press(*" fish")
        await wait_until(lambda: table.row_count == 1, pilot=pilot)
        assert table.get_row_at(0)[0] == "soup"
        await pilot.press("enter")  # opens the one found
        await wait_until(lambda: app.chat.state.session_name == "soup", pilot=pilot)


async def test_a_search_that_finds_nothing_says_so_and_clearing_it_lists_all(make_app, settings):
    save(settings.sessions_dir, "trip", "Plan three days in Lisbon", "Start at the castle.")
    save(settings.sessions_dir, "rust", "What is a borrow checker?", "It checks borrows.")
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        screen = await open_browser(app, pilot, 2)
        table = screen.query_one(DataTable)
        screen.query_one("#sessions-search", Input).value = "zebra"
        await wait_until(lambda: table.row_count == 0, pilot=pilot)
        assert "No saved session contains 'zebra'" in str(screen.query_one("#sessions-detail").render())
        screen.query_one("#sessions-search", Input).value = ""
        await wait_until(lambda: table.row_count == 2, pilot=pilot)
        assert [str(c.label) for c in table.columns.values()][:2] == ["name", "model"]
