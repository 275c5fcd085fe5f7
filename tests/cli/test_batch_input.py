"""Batch input and output edge cases, without the model: parsing, reading, targets, session names."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from radixchat.batch import BatchOptions
from radixchat.batch.input import check_session_names, parse_lines, read_input
from radixchat.batch.output import check_targets
from radixchat.errors import RadixchatError

GOOD = '{"id": "ok", "turns": ["Hi"]}'


def errors(text: str) -> dict[int, str | None]:
    return {job.line: job.error for job in parse_lines(text)}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"id": "s", "turns": ["Hi \\ud800"]}', "invalid JSON: a string holds a lone UTF-16 surrogate"),
        ('{"id": "\\udfff", "turns": ["x"]}', "invalid JSON: a string holds a lone UTF-16 surrogate"),
        ('{"id": "n", "turns": ["x"], "temperature": NaN}', "invalid JSON: NaN is not a JSON number"),
        ('{"id": "n", "turns": ["x"], "top_p": Infinity}', "invalid JSON: Infinity is not a JSON number"),
        ('{"id": "big", "turns": ["x"], "seed": ' + "9" * 5000 + "}", "invalid JSON: Exceeds the limit"),
        ("[" * 100_000, "invalid JSON: nested too deeply"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"id": true, "turns": ["x"]}', "id: must be a string or an integer"),
        ('{"id": 1.0, "turns": ["x"]}', "id: must be a string or an integer"),
        ('{"id": "t", "turns": ["x", 3]}', "(id 't'): turns[1]: Input should be a valid string"),
        ('{"id": "t", "turns": ["x"], "max_tokens": "5"}', "max_tokens: Input should be a valid integer"),
        ('{"id": "t", "turns": ["x"], "max_tokens": true}', "max_tokens: Input should be a valid integer"),
        ('{"id": "t", "turns": ["x"], "temperature": "0.5"}', "temperature: Input should be a valid number"),
        ('{"id": "t", "turns": ["x"], "seed": 1180591620717411303424}', "seed: Input should be less than"),
        ('{"id": "t", "turns": ["x"], "seed": -1}', "seed: Input should be greater than or equal to 0"),
        ('{"id": "t", "turns": ["x"], "repetition_penalty": 1e-300}', "repetition_penalty: Input should be"),
        ('{"id": "t", "turns": ["x"], "mode": "json", "schema": 5}', "(id 't'): schema: Input should be"),
        (
            '{"id": "t", "turns": ["x"], "mode": "tool", "tool_choice": {"name": 3}}',
            "(id 't'): tool_choice must",
        ),
    ],
)
def test_a_bad_line_is_an_error_naming_the_line_and_the_others_still_parse(line, expected):
    got = errors(f"{GOOD}\n{line}\n{GOOD.replace('ok', 'ok2')}")
    assert got[1] is None and got[3] is None
    assert got[2] is not None and got[2].startswith("line 2") and expected in got[2], got[2]


def test_numbers_may_be_integers_where_floats_are_expected():
    assert errors('{"id": 7, "turns": ["x"], "temperature": 1, "top_p": 1}') == {1: None}


def test_lines_end_at_newline_only_and_crlf_is_fine():
    text = '{"id": "a", "turns": ["one\u2028two\x85three"]}\r\n{"id": "b", "turns": ["x"]}\r\n'
    jobs = parse_lines(text)
    assert [(j.line, j.error) for j in jobs] == [(1, None), (2, None)]
    assert jobs[0].spec.turns == ["one\u2028two\x85three"]


def test_input_is_utf8_with_an_optional_bom(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\n")
    assert [j.error for j in parse_lines(read_input(str(path)))] == [None]
    path.write_bytes(GOOD.encode() + b"\n" + b'{"id": "x", "turns": ["\xff"]}\n')
    with pytest.raises(RadixchatError, match=r"batch file .*: line 2 is not UTF-8 \(byte \d+\)"):
        read_input(str(path))


def test_stdin_that_is_closed_or_not_utf8_is_a_usage_error(monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(RadixchatError, match="cannot read stdin: it is closed"):
        read_input("-")

    class Bytes:
        buffer = __import__("io").BytesIO(b"\x80\n")

    monkeypatch.setattr(sys, "stdin", Bytes())
    with pytest.raises(RadixchatError, match="cannot read stdin: line 1 is not UTF-8"):
        read_input("-")


def ns(**kw) -> BatchOptions:
    return BatchOptions("-", **kw)


def test_targets_are_checked_before_anything_is_written(tmp_path):
    existing = tmp_path / "out.jsonl"
    existing.write_text("keep me\n")
    check_targets(ns(output=str(existing), save_sessions=tmp_path / "new" / "sessions"))
    assert existing.read_text() == "keep me\n"  # checked, not truncated
    assert (tmp_path / "new" / "sessions").is_dir()
    check_targets(ns(output="-"))
    with pytest.raises(RadixchatError, match="folder .* does not exist"):
        check_targets(ns(output=str(tmp_path / "missing" / "out.jsonl")))
    with pytest.raises(RadixchatError, match="it is a folder"):
        check_targets(ns(output=str(tmp_path)))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(RadixchatError, match="--save-sessions: cannot create"):
        check_targets(ns(save_sessions=blocker / "sessions"))
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(RadixchatError, match="permission denied"):
            check_targets(ns(output=str(locked / "out.jsonl")))


def test_ids_that_would_share_a_session_file_fail_the_later_line(tmp_path: Path):
    lines = [{"id": "a/b", "turns": ["x"]}, {"id": "a-b", "turns": ["x"]}, {"id": "c", "turns": ["x"]}]
    jobs = parse_lines("\n".join(json.dumps(r) for r in lines))
    check_session_names(jobs, tmp_path)
    assert jobs[0].spec is not None and jobs[2].spec is not None
    assert jobs[1].spec is None
    assert jobs[1].error == (
        "line 2 (id 'a-b'): its session file a-b.json would overwrite the one of line 1 (id 'a/b'); "
        "use ids that differ in letters or digits"
    )


def test_attachments_are_read_relative_to_the_input_files_folder(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.py").write_text("x = 1\n")
    [job] = parse_lines('{"id": 1, "turns": ["Explain."], "attachments": ["docs/a.py"]}', tmp_path)
    assert job.error is None
    assert [(a.name, a.text, a.language) for a in job.attachments] == [("docs/a.py", "x = 1\n", "python")]


def test_an_attachment_that_cannot_be_read_is_its_lines_error(tmp_path: Path) -> None:
    (tmp_path / "img.bin").write_bytes(b"\x00\x01")
    text = "\n".join(
        [
            '{"id": "gone", "turns": ["x"], "attachments": ["missing.txt"]}',
            '{"id": "bin", "turns": ["x"], "attachments": ["img.bin"]}',
            '{"id": "ok", "turns": ["x"]}',
        ]
    )
    jobs = parse_lines(text, tmp_path)
    assert [j.error for j in jobs] == [
        "line 1 (id 'gone'): attachments: cannot attach missing.txt: no such file",
        "line 2 (id 'bin'): attachments: cannot attach img.bin: a binary file (only text, code and PDF "
        "can be attached)",
        None,
    ]
    assert jobs[0].spec is None and jobs[1].spec is None


def test_attachments_must_be_a_list_of_paths() -> None:
    assert "attachments" in errors('{"id": 1, "turns": ["x"], "attachments": "a.txt"}')[1]
