"""``radixchat -c`` / ``--continue``: the session saved last reopens in the app (the app itself is not
run here: ``run_app`` is replaced by a recorder)."""

from __future__ import annotations

import os

import pytest

from radixchat import cli
from radixchat.chat.session import SessionFile, SessionMessage, latest_session, save_session, session_path
from radixchat.exit_codes import ExitCode


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith("RADIXCHAT_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def opened(monkeypatch) -> list[object]:
    """What ``run_app`` was asked to open, once per run."""
    calls: list[object] = []

    def run_app(settings, session=None, backend_factory=None) -> int:
        calls.append(session)
        return 0

    monkeypatch.setattr("radixchat.tui.app.run_app", run_app)
    return calls


def saved(folder, name: str, mtime: float) -> None:
    session = SessionFile(name=name, model="m", messages=[SessionMessage(role="user", content=name)])
    path = save_session(session, session_path(folder, name))
    os.utime(path, (mtime, mtime))


def test_latest_session_is_the_newest_file_by_modification_time(tmp_path):
    saved(tmp_path, "old", 1_000)
    saved(tmp_path, "new", 3_000)
    saved(tmp_path, "middle", 2_000)
    assert latest_session(tmp_path) == tmp_path / "new.json"


def test_latest_session_of_an_empty_or_missing_folder_is_none(tmp_path):
    assert latest_session(tmp_path) is None
    assert latest_session(tmp_path / "missing") is None


def test_continue_opens_the_session_saved_last_in_the_app(tmp_path, opened):
    saved(tmp_path, "old", 1_000)
    saved(tmp_path, "new", 2_000)
    assert cli.main(["-c", "--sessions-dir", str(tmp_path)]) == 0
    (session,) = opened
    assert isinstance(session, SessionFile) and session.name == "new"


def test_continue_with_nothing_saved_says_so_and_starts_a_new_chat(tmp_path, opened, capsys):
    assert cli.main(["--continue", "--sessions-dir", str(tmp_path)]) == 0
    assert opened == [None]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no saved session" in err[0] and "starting a new conversation" in err[0]


def test_continue_refuses_a_last_session_that_does_not_load(tmp_path, opened, capsys):
    saved(tmp_path, "good", 1_000)
    (tmp_path / "broken.json").write_text('{"version": 3, "name": ')
    assert cli.main(["-c", "--sessions-dir", str(tmp_path)]) == ExitCode.USAGE
    assert opened == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "broken.json" in err[0]
    assert (tmp_path / "broken.json").read_text() == '{"version": 3, "name": '


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--session", "x"], "cannot be used with --session"),
        (["--batch", "-"], "cannot be used with --batch"),
    ],
)
def test_continue_with_a_flag_that_names_another_session_is_a_usage_error(
    tmp_path, opened, capsys, args, message
):
    assert cli.main(["-c", *args, "--sessions-dir", str(tmp_path)]) == ExitCode.USAGE
    assert opened == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
