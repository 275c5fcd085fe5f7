"""``radixchat --batch``: the JSON Lines contract and exit codes, through the installed command."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from radixchat.chat.session import SESSION_VERSION

pytestmark = pytest.mark.real_model

RADIXCHAT = shutil.which("radixchat") or str(Path(sys.executable).with_name("radixchat"))
FIELDS = {
    "id",
    "line",
    "turn",
    "reply",
    "reasoning",
    "finish_reason",
    "usage",
    "ttft_ms",
    "decode_tokens_per_s",
    "tool_calls",
    "tool_notes",
    "schema_errors",
    "dropped_turns",
    "error",
}


def run(args, stdin=None, timeout=300, env=None):
    return subprocess.run(
        [RADIXCHAT, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "RADIXCHAT_TEMPERATURE": "0", **(env or {})},
    )


def records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


SYSTEM = "You are a concise assistant. Answer in one short sentence."


def test_conversations_run_and_turn_two_reuses_turn_one(tmp_path):
    rows = [
        {"id": f"c{i}", "system": SYSTEM, "turns": [q, "Say it again, shorter."], "max_tokens": 16}
        for i, q in enumerate(["What is the sun?", "What is rain?", "What is a tree?"])
    ]
    proc = run(["--batch", str(write_jsonl(tmp_path / "in.jsonl", rows)), "--ordered"])
    assert proc.returncode == 0, proc.stderr
    recs = records(proc.stdout)
    assert [(r["id"], r["turn"]) for r in recs] == [(f"c{i}", t) for i in range(3) for t in (0, 1)]
    for r in recs:
        assert set(r) == FIELDS and r["error"] is None and r["finish_reason"] in ("stop", "length")
        assert isinstance(r["reply"], str) and r["reply"]
        assert r["usage"]["completion_tokens"] >= 1 and r["ttft_ms"] > 0
    for first, second in zip(recs[::2], recs[1::2]):
        u1, u2 = first["usage"], second["usage"]
        assert u2["cached_tokens"] >= u1["prompt_tokens"] + u1["completion_tokens"] - 1
    # The shared system prompt is computed once: later conversations' first turns hit it.
    assert sum(r["usage"]["cached_tokens"] for r in recs[::2]) > 0
    assert "3 conversations, 6 turns" in proc.stderr and "cached" in proc.stderr


def test_stdin_input_and_output_file(tmp_path):
    out = tmp_path / "out.jsonl"
    line = json.dumps({"id": 7, "turns": ["Hi"], "max_tokens": 4})
    proc = run(["--batch", "-", "--output", str(out)], stdin=line + "\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    (rec,) = records(out.read_text())
    assert rec["id"] == 7 and rec["turn"] == 0 and rec["usage"]["completion_tokens"] <= 4


def test_bad_lines_get_error_records_and_others_still_run(tmp_path):
    rows = [
        "{not json",
        {"id": "wrong-type", "turns": "hello"},
        {"id": "bad-mode", "turns": ["x"], "mode": "poetry"},
        {"id": "bad-temp", "turns": ["x"], "temperature": 9},
        {"id": "extra", "turns": ["x"], "tempurature": 1},
        {"id": "good", "turns": ["Hello"], "max_tokens": 4},
        {"id": "good", "turns": ["Hello again"], "max_tokens": 4},
        {"id": "bad-schema", "turns": ["x"], "mode": "chat", "schema": {"type": "object"}},
    ]
    proc = run(["--batch", str(write_jsonl(tmp_path / "in.jsonl", rows)), "--ordered"])
    assert proc.returncode == 1
    recs = records(proc.stdout)
    by_line = {r["line"]: r for r in recs}
    assert "line 1: invalid JSON" in by_line[1]["error"]
    assert "line 2 (id 'wrong-type'): turns" in by_line[2]["error"]
    assert "mode" in by_line[3]["error"] and "temperature" in by_line[4]["error"]
    assert "tempurature" in by_line[5]["error"]
    assert by_line[6]["error"] is None and by_line[6]["reply"]
    assert "duplicate id" in by_line[7]["error"]
    assert "schema" in by_line[8]["error"]
    assert "Traceback" not in proc.stderr


def test_usage_errors_exit_2(tmp_path):
    proc = run(["--batch", str(tmp_path / "missing.jsonl")])
    assert proc.returncode == 2 and "batch file not found" in proc.stderr
    proc = run(["--batch", "-"], stdin="\n\n")
    assert proc.returncode == 2 and "no conversations" in proc.stderr
    proc = run(["--ordered"])
    assert proc.returncode == 2 and "need --batch" in proc.stderr
    proc = run(["--batch", "-", "--top-p", "7"], stdin="{}")
    assert proc.returncode == 2 and "invalid setting 'top_p'" in proc.stderr
    proc = run(["--batch", "-", "--weights", "int3"], stdin="{}")
    assert proc.returncode == 2 and "invalid setting 'weights'" in proc.stderr and "'int4'" in proc.stderr
    proc = run(["--batch", "-", "--kv-dtype", "int8"], stdin="{}")
    assert proc.returncode == 2 and "invalid setting 'kv_dtype'" in proc.stderr and "'float16'" in proc.stderr
    proc = run(["--batch", "-"], stdin="{}", env={**os.environ, "RADIXCHAT_DETERMINISTIC": "perhaps"})
    assert proc.returncode == 2 and "invalid setting 'deterministic'" in proc.stderr
    proc = run(["--batch", "-", "--context-overflow", "truncate"], stdin="{}")
    assert proc.returncode == 2 and "invalid setting 'context_overflow'" in proc.stderr
    assert "'drop-oldest' or 'error'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    # A compact format runs on the CPU only: said before any model loads, naming what can run.
    proc = run(["--batch", "-", "--weights", "int4", "--device", "cuda"], stdin="{}")
    assert proc.returncode == 2 and "weights format 'int4' cannot run" in proc.stderr
    assert "choose one of: auto, float32" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_model_load_failure_exits_3_and_leaves_the_output_file_alone(tmp_path):
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "turns": ["x"]}])
    before = path.read_bytes()
    # Even the input given as the output survives: nothing is truncated before the model is ready.
    proc = run(["--batch", str(path), "-o", str(path), "--model", str(tmp_path / "no-such-model")])
    assert proc.returncode == 3 and "not found" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert path.read_bytes() == before


def test_a_closed_output_pipe_stops_the_run_with_one_line(tmp_path):
    rows = [{"id": f"c{i}", "turns": ["Hi", "Again"], "max_tokens": 3} for i in range(3)]
    proc = subprocess.Popen(
        [RADIXCHAT, "--batch", str(write_jsonl(tmp_path / "in.jsonl", rows))],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RADIXCHAT_TEMPERATURE": "0"},
    )
    first = proc.stdout.readline()  # as `| head -1` does
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert json.loads(first)["error"] is None
    assert proc.returncode == 1
    assert err.strip().splitlines() == ["radixchat: cannot write the output: Broken pipe"]


def test_saved_sessions_continue_in_a_new_run(tmp_path):
    sessions = tmp_path / "sessions"
    rows = [{"id": "s1", "system": SYSTEM, "turns": ["Name a fruit."], "max_tokens": 12, "seed": 7}]
    proc = run(["--batch", str(write_jsonl(tmp_path / "a.jsonl", rows)), "--save-sessions", str(sessions)])
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((sessions / "s1.json").read_text())
    assert saved["version"] == SESSION_VERSION
    assert [m["role"] for m in saved["messages"]] == ["system", "user", "assistant"]
    first = records(proc.stdout)[0]

    rows = [{"id": "s1b", "session": str(sessions / "s1.json"), "turns": ["Another one."], "max_tokens": 10}]
    proc = run(["--batch", str(write_jsonl(tmp_path / "b.jsonl", rows)), "--save-sessions", str(sessions)])
    assert proc.returncode == 0, proc.stderr
    (rec,) = records(proc.stdout)
    u1 = first["usage"]
    # A fresh process has an empty cache, but the prompt is exactly the saved ids plus the delta.
    assert rec["usage"]["prompt_tokens"] > u1["prompt_tokens"] + u1["completion_tokens"]
    cont = json.loads((sessions / "s1b.json").read_text())
    assert [m["role"] for m in cont["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert cont["messages"][2]["token_ids"] == saved["messages"][2]["token_ids"]
    # The continued session keeps what it was saved with; the new line's values win.
    assert (cont["sampling"]["seed"], cont["sampling"]["max_tokens"]) == (7, 10)


def test_a_continued_session_is_warm_from_the_kv_store_and_replies_the_same(tmp_path, smol_dir):
    cache = tmp_path / "cache"  # a cache directory of its own (the KV store is <cache_dir>/kv) ...
    cache.mkdir()
    (cache / "models").symlink_to(smol_dir.parent)  # ... sharing the converted model
    env = {"RADIXCHAT_CACHE_DIR": str(cache), "RADIXCHAT_KV_STORE": "true"}
    sessions = tmp_path / "sessions"
    rows = [{"id": "s1", "system": SYSTEM, "turns": ["Name a fruit and its colour."], "max_tokens": 24}]
    proc = run(
        ["--batch", str(write_jsonl(tmp_path / "a.jsonl", rows)), "--save-sessions", str(sessions)], env=env
    )
    assert proc.returncode == 0 and "KV" not in proc.stderr, proc.stderr
    u1 = records(proc.stdout)[0]["usage"]
    assert list((cache / "kv").rglob("*.safetensors"))  # the session's KV went beside it

    again = write_jsonl(
        tmp_path / "b.jsonl", [{"id": "s1b", "session": str(sessions / "s1.json"), "turns": ["Another one."]}]
    )
    warm = records(run(["--batch", str(again)], env=env).stdout)[0]
    # A new process: the history came from disk, so only the new turn (and one token) is prefilled.
    assert warm["usage"]["cached_tokens"] == u1["prompt_tokens"] + u1["completion_tokens"] - 1
    cold = records(run(["--batch", str(again)], env={**env, "RADIXCHAT_KV_STORE": "false"}).stdout)[0]
    assert cold["usage"]["cached_tokens"] == 0
    assert (
        warm["reply"] == cold["reply"]
        and warm["usage"]["completion_tokens"] == cold["usage"]["completion_tokens"]
    )


def test_session_for_another_model_is_an_error_record(tmp_path):
    session = tmp_path / "other.json"
    session.write_text(json.dumps({"version": 1, "name": "o", "model": "another-model", "messages": []}))
    path = write_jsonl(tmp_path / "in.jsonl", [{"id": "o", "session": str(session), "turns": ["x"]}])
    before = session.read_bytes()
    proc = run(["--batch", str(path)])
    assert proc.returncode == 1
    assert "saved with model 'another-model'" in records(proc.stdout)[0]["error"]
    assert session.read_bytes() == before


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_flushes_completed_turns_and_exits_128_plus_signal(tmp_path, signum, code):
    essay = "Write a very long essay about rivers."
    rows = [
        {"id": "quick", "turns": ["Hi"], "max_tokens": 2},
        {"id": "two", "turns": ["Hi", essay], "max_tokens": 2000},  # its first turn is short
        {"id": "long", "turns": [essay], "max_tokens": 2000},
    ]
    out, sessions = tmp_path / "out.jsonl", tmp_path / "sessions"
    proc = subprocess.Popen(
        [RADIXCHAT, "--batch", str(write_jsonl(tmp_path / "in.jsonl", rows)), "-o", str(out)]
        + ["--ordered", "--save-sessions", str(sessions)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RADIXCHAT_TEMPERATURE": "0", "RADIXCHAT_REPETITION_PENALTY": "1.3"},
    )
    deadline = time.time() + 180
    while time.time() < deadline and not (out.exists() and '"two"' in out.read_text()):
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    recs = records(out.read_text())
    assert [(r["id"], r["turn"]) for r in recs] == [("quick", 0), ("two", 0)]
    assert all(r["error"] is None for r in recs)
    assert f"interrupted ({signal.Signals(signum).name})" in err and "Traceback" not in err
    # The completed turn of the interrupted conversation is saved, without the turn in flight.
    saved = json.loads((sessions / "two.json").read_text())
    assert [m["role"] for m in saved["messages"]] == ["user", "assistant"]
    assert not (sessions / "long.json").exists()


def test_batch_mode_does_not_import_textual():
    code = (
        "import sys, radixchat.cli, radixchat.batch; "
        "assert not any(m == 'textual' or m.startswith('textual.') for m in sys.modules), 'textual imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_json_mode_lines_give_schema_valid_replies(tmp_path):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"}},
        "required": ["city", "population"],
    }
    rows = [
        {
            "id": "j1",
            "mode": "json",
            "schema": schema,
            "turns": ["Paris as JSON.", "Now Berlin."],
            "max_tokens": 48,
        },
        {
            "id": "j2",
            "mode": "json",
            "turns": ["Any JSON about cats."],
            "max_tokens": 48,
            "temperature": 1.0,
            "seed": 3,
        },
        {"id": "j3", "mode": "json", "schema": {"type": "object", "not": {}}, "turns": ["x"]},
        {
            "id": "j4",
            "mode": "json",
            "schema_mode": "lenient",
            "schema": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 3},
            "turns": ["Three small numbers as a JSON array."],
            "max_tokens": 24,
        },
    ]
    proc = run(["--batch", str(write_jsonl(tmp_path / "in.jsonl", rows)), "--ordered"])
    assert proc.returncode == 1
    recs = records(proc.stdout)
    for r in recs[:2]:
        assert r["finish_reason"] == "stop", r
        jsonschema.validate(json.loads(r["reply"]), schema)
    assert recs[2]["id"] == "j2" and isinstance(json.loads(recs[2]["reply"]), dict)
    assert recs[3]["id"] == "j3" and "unsupported keyword 'not'" in recs[3]["error"]
    assert all(r["schema_errors"] == [] for r in recs[:3])
    lenient = recs[4]
    assert lenient["id"] == "j4" and lenient["error"] is None, lenient
    items = json.loads(lenient["reply"])
    assert isinstance(items, list) and len(items) <= 3 and all(isinstance(i, int) for i in items)
    # uniqueItems is not enforced by the grammar: the check of the finished reply reports it if broken
    assert (lenient["schema_errors"] == []) == (len(set(items)) == len(items))


def test_tool_mode_lines_report_calls_and_user_tools_need_allowing(tmp_path):
    script = tmp_path / "shout.py"
    script.write_text("import json, sys\nprint(json.load(sys.stdin)['text'].upper())\n")
    config = tmp_path / "config.toml"
    config.write_text(
        "[[tools]]\n"
        'name = "shout"\n'
        'description = "Upper-case a text."\n'
        f'command = ["{sys.executable}", "{script}"]\n'
        'parameters = {type = "object", properties = {text = {type = "string", maxLength = 20}}, required = ["text"]}\n'
    )
    rows = [
        {
            "id": "calc",
            "mode": "tool",
            "tools": ["calculator"],
            "tool_choice": {"name": "calculator"},
            "turns": ["What is 6*7?"],
            "max_tokens": 60,
        },
        {
            "id": "shout",
            "mode": "tool",
            "tools": ["shout"],
            "tool_choice": "required",
            "turns": ["Shout hello."],
            "max_tokens": 60,
        },
        {"id": "bad", "mode": "tool", "tools": ["nope"], "turns": ["x"]},
        {"id": "bad2", "mode": "chat", "tools": ["calculator"], "turns": ["x"]},
    ]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    proc = run(["--config", str(config), "--batch", str(path), "--ordered"])
    recs = records(proc.stdout)
    calc, shout, bad, bad2 = recs[0], recs[1], recs[-2], recs[-1]
    assert calc["tool_calls"] and calc["tool_calls"][0]["name"] == "calculator"
    assert isinstance(calc["tool_calls"][0]["arguments"], dict) and isinstance(calc["reply"], str)
    assert shout["tool_calls"][0]["name"] == "shout"
    assert "did not allow" in shout["tool_calls"][0]["error"]
    assert "unknown tool 'nope'" in bad["error"] and 'need "mode": "tool"' in bad2["error"]

    proc = run(["--config", str(config), "--batch", str(path), "--ordered", "--allow-tools", "shout"])
    shout = records(proc.stdout)[1]
    assert shout["tool_calls"][0]["error"] is None and shout["tool_calls"][0]["result"].isupper()
    proc = run(["--config", str(config), "--batch", str(path), "--allow-tools", "calculator"])
    assert proc.returncode == 2 and "not a user tool" in proc.stderr


def test_sigkill_leaves_written_lines_and_session_files_valid(tmp_path):
    from radixchat.chat.session import load_session

    rows = [
        {"id": f"q{i}", "turns": ["Hi", "Tell me more"], "max_tokens": 3 if i < 3 else 400} for i in range(6)
    ]
    out, sessions = tmp_path / "out.jsonl", tmp_path / "sessions"
    proc = subprocess.Popen(
        [
            RADIXCHAT,
            "--batch",
            str(write_jsonl(tmp_path / "in.jsonl", rows)),
            "--output",
            str(out),
            "--save-sessions",
            str(sessions),
        ],
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RADIXCHAT_TEMPERATURE": "0", "RADIXCHAT_REPETITION_PENALTY": "1.3"},
    )
    deadline = time.time() + 120
    while time.time() < deadline and not (sessions.exists() and any(sessions.glob("*.json"))):
        time.sleep(0.1)
    proc.kill()
    proc.wait(timeout=30)
    lines = out.read_text().splitlines()
    assert lines, "some turns finished before the kill"
    for line in lines:
        rec = json.loads(line)  # every written line is complete JSON
        assert set(rec) == FIELDS
    saved = list(sessions.glob("*.json"))
    assert saved
    for path in saved:
        load_session(path)  # every session file on disk is complete and valid


def test_a_conversation_that_outgrows_the_context_drops_its_oldest_turns(tmp_path):
    """With a 320-token context (the pool), a long conversation goes on: its records say how many turns left
    the context; with "context_overflow": "error" the turn that no longer fits is an error record instead;
    a bad value is an error record naming the choices."""
    turns = [f"Remember item {i}: a red box with the number {i * 7} written on it." for i in range(10)]
    rows = [
        {"id": "drop", "turns": turns, "max_tokens": 12, "temperature": 0},
        {"id": "strict", "turns": turns, "max_tokens": 12, "temperature": 0, "context_overflow": "error"},
        {"id": "bad", "turns": ["x"], "context_overflow": "truncate"},
    ]
    proc = run(
        ["--batch", str(write_jsonl(tmp_path / "in.jsonl", rows)), "--kv-pool-tokens", "320", "--ordered"]
    )
    assert proc.returncode == 1, proc.stderr  # the strict and the bad line fail; the other runs to the end
    recs = records(proc.stdout)
    drop = [r for r in recs if r["id"] == "drop"]
    assert len(drop) == 10 and all(r["error"] is None for r in drop)
    assert sum(r["dropped_turns"] for r in drop) >= 1 and drop[0]["dropped_turns"] == 0
    assert all(r["usage"]["prompt_tokens"] < 320 for r in drop)
    strict = [r for r in recs if r["id"] == "strict"]
    assert 1 < len(strict) < 10 and all(r["dropped_turns"] == 0 for r in strict)
    assert "no longer fits the model's context of 320 tokens" in strict[-1]["error"]
    (bad,) = [r for r in recs if r["id"] == "bad"]
    assert "context_overflow" in bad["error"] and "'drop-oldest'" in bad["error"]


def test_a_lines_attachments_go_into_its_first_turn_before_the_text(tmp_path):
    (tmp_path / "notes.md").write_text("# Notes\n\nThe launch moves to May.\n")
    composed = "File: notes.md\n```markdown\n# Notes\n\nThe launch moves to May.\n```\n\nWhen is the launch?"
    rows = [
        {"id": "attached", "turns": ["When is the launch?", "Thanks."], "attachments": ["notes.md"]},
        {"id": "written", "turns": [composed, "Thanks."]},
        {"id": "missing", "turns": ["x"], "attachments": ["../nope/missing.md"]},
    ]
    proc = run(["--batch", str(write_jsonl(tmp_path / "in.jsonl", rows)), "--ordered", "--max-tokens", "12"])
    assert proc.returncode == 1, proc.stderr
    recs = records(proc.stdout)
    replies = {(r["id"], r["turn"]): r["reply"] for r in recs}
    assert replies[("attached", 0)] == replies[("written", 0)]
    assert replies[("attached", 1)] == replies[("written", 1)]
    assert (
        recs[-1]["error"]
        == "line 3 (id 'missing'): attachments: cannot attach ../nope/missing.md: no such file"
    )
