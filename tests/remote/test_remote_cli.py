"""``--backend URL`` from the command line: settings, ``--list-models``, and batch mode on a (fake) server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from radixchat.cli import main
from radixchat.config import Settings
from radixchat.errors import ConfigError
from tests.remote.fake_server import Status, Stream

RADIXCHAT = shutil.which("radixchat") or str(Path(sys.executable).with_name("radixchat"))
SECRET = "sk-test-never-stored-4242"


def closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_backend_is_local_by_default_and_a_bare_host_gets_v1():
    assert Settings.load({}).backend == "local"
    assert Settings.load({"backend": "http://gpu-box:30000"}).backend == "http://gpu-box:30000/v1"
    assert Settings.load({"backend": "https://h/api/v1/"}).backend == "https://h/api/v1"


def test_a_backend_that_is_not_a_url_is_a_config_error():
    with pytest.raises(
        ConfigError, match=r"^invalid setting 'backend': must be 'local' or an http\(s\):// URL"
    ):
        Settings.load({"backend": "gpu-box:30000"})


def test_list_models_prints_what_the_server_offers(fake, capsys):
    fake.models = ["org/model-a", "model-b"]
    assert main(["--backend", fake.url, "--list-models"]) == 0
    assert capsys.readouterr().out.splitlines() == ["org/model-a", "model-b"]


def test_list_models_on_an_unreachable_server_exits_3_with_one_line(capsys):
    url = closed_port_url()
    assert main(["--backend", url, "--list-models"]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"radixchat: cannot reach {url} (listing models)") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("key", "what"), [(SECRET + "\n", "a control character"), (SECRET + "é", "non-ASCII")]
)
def test_an_api_key_unfit_for_a_header_is_a_usage_error_that_never_shows_it(
    fake, capsys, monkeypatch, key, what
):
    monkeypatch.setenv("OPENAI_API_KEY", key)
    assert main(["--backend", fake.url, "--list-models"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("radixchat: $OPENAI_API_KEY holds ") and what in err and "4242" not in err
    assert not fake.requests


def test_list_models_on_a_url_without_the_api_path_says_so(fake, capsys):
    url = fake.url.removesuffix("/v1") + "/nope"
    assert main(["--backend", url, "--list-models"]) == 3
    err = capsys.readouterr().err
    assert "404 Not Found (listing models): the URL probably lacks its API path (usually /v1)" in err
    assert "model" not in err.split("(listing models)")[1]


def test_list_models_needs_a_backend(capsys):
    assert main(["--list-models"]) == 2
    assert "--list-models needs --backend URL" in capsys.readouterr().err


def test_batch_with_a_model_the_server_does_not_serve_exits_3(fake, tmp_path, capsys):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "turns": ["Hi"]}])
    assert main(["--backend", fake.url, "--model", "nope", "--batch", str(path)]) == 3
    assert "model 'nope' is not served by" in capsys.readouterr().err
    assert fake.chat_requests == []


def test_batch_sessions_continue_on_the_server_with_their_history(fake, tmp_path, capsys):
    sessions = tmp_path / "sessions"
    first = write_jsonl(tmp_path / "1.jsonl", [{"id": "s", "system": "Be brief.", "turns": ["Hi"]}])
    assert main(["--backend", fake.url, "--batch", str(first), "--save-sessions", str(sessions)]) == 0
    saved = json.loads((sessions / "s.json").read_text())
    assert saved["model"] == "fake-model" and all(m["token_ids"] is None for m in saved["messages"])
    second = write_jsonl(
        tmp_path / "2.jsonl", [{"id": "s2", "session": str(sessions / "s.json"), "turns": ["More"]}]
    )
    assert main(["--backend", fake.url, "--batch", str(second)]) == 0
    sent = fake.chat_requests[-1]["body"]["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello there!"),
        ("user", "More"),
    ]
    capsys.readouterr()


def test_batch_on_a_server_keeps_going_when_one_conversation_fails(fake, tmp_path):
    """Through the installed command: a conversation the server fails gets an error record, the others
    run, the exit code is 1; the API key is sent but never written to a session file."""
    fake.by_text["FAIL"] = Status(500, "model crashed")
    fake.by_text["JSON"] = Stream(deltas=['{"n": ', "1}"])
    rows = [
        {"id": "ok", "system": "Be brief.", "turns": ["Hi", "Again"]},
        {"id": "bad", "turns": ["FAIL now", "never sent"]},
        {"id": "js", "turns": ["JSON please"], "mode": "json", "schema": {"type": "object"}},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    sessions = tmp_path / "sessions"
    env = {**os.environ, "RC_KEY": SECRET, "RADIXCHAT_REMOTE_RETRIES": "1"}
    proc = subprocess.run(
        [
            RADIXCHAT,
            "--backend",
            fake.url,
            "--api-key-env",
            "RC_KEY",
            "--batch",
            str(path),
            "--ordered",
            "--save-sessions",
            str(sessions),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    recs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["id"], r["turn"], r["finish_reason"]) for r in recs] == [
        ("ok", 0, "stop"),
        ("ok", 1, "stop"),
        ("bad", 0, "error"),
        ("js", 0, "stop"),
    ]
    ok, bad = recs[0], recs[2]
    assert (
        ok["usage"] == {"prompt_tokens": 20, "cached_tokens": 12, "completion_tokens": 3}
        and ok["ttft_ms"] > 0
    )
    assert "failed with a server error (500) after 2 tries: model crashed" in bad["error"]
    assert json.loads(recs[3]["reply"]) == {"n": 1}
    assert fake.chat_requests[-1]["headers"]["authorization"] == f"Bearer {SECRET}"
    assert "3 conversations, 4 turns" in proc.stderr and "60.0% cached" in proc.stderr
    files = sorted(sessions.glob("*.json"))
    assert [f.name for f in files] == ["bad.json", "js.json", "ok.json"]
    assert not any(SECRET in f.read_text() for f in files)
    # The failed turn is in its record, not in the session: continuing it must not resend it.
    assert json.loads((sessions / "bad.json").read_text())["messages"] == []
