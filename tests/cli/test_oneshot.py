"""``radixchat -p PROMPT``: one reply on stdout, through the installed command.

The oracle is batch mode: greedy, with the same settings, ``-p`` must print exactly the reply a batch line
with the same prompt gets (one batch run gives every expected reply).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_model

RADIXCHAT = shutil.which("radixchat") or str(Path(sys.executable).with_name("radixchat"))
SETTINGS = ["--temperature", "0", "--max-tokens", "12"]
QUESTION = "What is the capital of France?"
NOTES = "Meeting notes: the team chose blue for the logo.\nThe launch moves to May.\n"
SUMMARY_ASK = "Summarise this in one sentence."
STDIN_PROMPT = "Name three colours."
NOTES_FILE = "notes.txt"


def run(args, stdin: str = "", timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """The command with stdin a pipe holding ``stdin`` (empty: nothing piped)."""
    return subprocess.run(
        [RADIXCHAT, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=os.environ
    )


def printed(reply: str) -> str:
    """What ``-p`` prints for a reply: the reply, ending in one newline."""
    return reply if reply.endswith("\n") else reply + "\n"


@pytest.fixture(scope="module")
def batch_replies(tmp_path_factory) -> dict[str, str]:
    prompts = {
        "question": QUESTION,
        "piped": NOTES.rstrip() + "\n\n" + SUMMARY_ASK,
        "stdin": STDIN_PROMPT,
        "attached": f"File: {NOTES_FILE}\n```\n{NOTES}```\n\n{SUMMARY_ASK}",
    }
    path = tmp_path_factory.mktemp("oneshot") / "in.jsonl"
    path.write_text("".join(json.dumps({"id": k, "turns": [v]}) + "\n" for k, v in prompts.items()))
    proc = run(["--batch", str(path), *SETTINGS])
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in proc.stdout.splitlines()]
    return {r["id"]: r["reply"] for r in recs}


def test_the_reply_is_stdout_alone_and_equals_batch_modes(batch_replies):
    proc = run(["-p", QUESTION, *SETTINGS])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed(batch_replies["question"])
    assert proc.stderr == ""  # not a terminal: no loading line, and nothing went wrong


def test_piped_text_comes_before_the_question_after_a_blank_line(batch_replies):
    proc = run(["-p", SUMMARY_ASK, *SETTINGS], stdin=NOTES)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed(batch_replies["piped"])


def test_dash_reads_the_whole_prompt_from_stdin(batch_replies):
    proc = run(["-p", "-", *SETTINGS], stdin=STDIN_PROMPT + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed(batch_replies["stdin"])


def test_attached_files_come_before_the_question_as_named_blocks(batch_replies, tmp_path, monkeypatch):
    (tmp_path / NOTES_FILE).write_text(NOTES)
    monkeypatch.chdir(tmp_path)
    proc = run(["-p", SUMMARY_ASK, "-a", NOTES_FILE, *SETTINGS])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == printed(batch_replies["attached"])


def test_json_gives_a_json_object():
    proc = run(["-p", "Describe a cat as JSON.", "--json", "--temperature", "0", "--max-tokens", "48"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n") and isinstance(json.loads(proc.stdout), dict)


def test_schema_gives_a_reply_valid_for_the_schema_file(tmp_path):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"}},
        "required": ["city", "population"],
    }
    (tmp_path / "city.json").write_text(json.dumps(schema))
    args = ["-p", "Paris as JSON.", "--schema", str(tmp_path / "city.json"), "--temperature", "0"]
    proc = run([*args, "--max-tokens", "48"])
    assert proc.returncode == 0, proc.stderr
    jsonschema.validate(json.loads(proc.stdout), schema)


def test_usage_errors_exit_2_with_one_line_before_the_model_loads(tmp_path):
    (tmp_path / "broken.json").write_text('{"type": "object",')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad-type.json").write_text('{"type": "strnig"}')
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff\x00")
    cases = [
        (["-p", ""], "", "the prompt is empty"),
        (["-p", "   "], "some piped text", "the prompt is empty"),
        (["-p", "-"], "\n\n", "stdin is empty"),
        (["-p", "x", "--schema", str(tmp_path / "missing.json")], "", "file not found"),
        (["-p", "x", "--schema", str(tmp_path / "broken.json")], "", "invalid JSON"),
        (["-p", "x", "--schema", str(tmp_path / "list.json")], "", "not a list"),
        (["-p", "x", "--schema", str(tmp_path / "bad-type.json")], "", "not a valid JSON Schema"),
        (["--json"], "", "need -p"),
        (["-p", "x", "-a", str(tmp_path / "photo.jpg")], "", "photo.jpg: a binary file"),
        (["-p", "x", "-a", str(tmp_path / "gone.txt")], "", "gone.txt: no such file"),
        (["-a", str(tmp_path / "gone.txt")], "", "--attach needs -p"),
        (["-p", "x", "--batch", "-"], "", "cannot be used together"),
    ]
    for args, stdin, message in cases:
        proc = run(args, stdin=stdin, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert proc.stdout == ""


def test_a_prompt_that_does_not_fit_the_context_is_one_line_naming_the_sizes():
    long_prompt = "Please read this. " * 200
    proc = run(["-p", long_prompt, "--kv-pool-tokens", "320", *SETTINGS])
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert "does not fit" in proc.stderr and "320 tokens" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_ctrl_c_keeps_what_was_printed_and_exits_130():
    proc = subprocess.Popen(
        [RADIXCHAT, "-p", "Write a very long essay about rivers.", "--max-tokens", "2000"]
        + ["--temperature", "0", "--repetition-penalty", "1.3"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = os.read(proc.stdout.fileno(), 4096)  # the reply has begun
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert first and (first + rest).endswith(b"\n")  # the printed part stays, and its line is ended
    assert err.decode().strip() == "radixchat: interrupted (SIGINT)"


def test_continue_replies_after_the_last_session_and_saves_the_turn_back(tmp_path):
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "trip", "turns": [QUESTION]}) + "\n")
    sessions = ["--sessions-dir", str(tmp_path / "sessions")]
    first = run(
        ["--batch", str(tmp_path / "in.jsonl"), "--save-sessions", str(tmp_path / "sessions"), *SETTINGS]
    )
    assert first.returncode == 0, first.stderr
    proc = run(["-c", "-p", "And of Italy?", *sessions, *SETTINGS])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and proc.stderr == ""
    session = json.loads((tmp_path / "sessions" / "trip.json").read_text())
    users = [m["content"] for m in session["messages"] if m["role"] == "user"]
    assert users == [QUESTION, "And of Italy?"]
    assert session["messages"][-1]["role"] == "assistant"
    assert session["messages"][-1]["content"].strip() == proc.stdout.strip()
