"""Batch input: the JSON Lines format (one conversation per line), read and checked before anything runs.

A line that cannot run becomes a ``Job`` carrying its error (named by line and id), so the other lines
still run and the error gets its own output record.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from radixchat.chat.attachments import Attachment, AttachmentError, read_attachment
from radixchat.chat.session import session_path
from radixchat.errors import RadixchatError


class BatchLine(BaseModel):
    """One input line: a conversation."""

    # Strict: "5" is not a number and true is not 1 (typos and type slips must not pass silently).
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True)

    id: str | int
    system: str | None = None
    turns: list[str] = Field(min_length=1)
    mode: Literal["chat", "json", "tool"] = "chat"
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    # strict: a keyword the grammar cannot enforce is an error; lenient: enforce what it can and report
    # what the finished reply breaks in "schema_errors".
    schema_mode: Literal["strict", "lenient"] = "strict"
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=5.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: list[str] | None = None
    session: str | None = None
    tools: list[str] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # When the history outgrows the model's context: drop its oldest turns, or fail the turn.
    context_overflow: Literal["drop-oldest", "error"] | None = None
    # Files (paths relative to the input file) that go into the first turn's message, before its text.
    attachments: list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> BatchLine:
        if self.session is not None and self.system is not None:
            raise ValueError(
                "'system' and 'session' cannot both be given (the session has its system prompt)"
            )
        if (self.json_schema is not None or "schema_mode" in self.model_fields_set) and self.mode != "json":
            raise ValueError("'schema' and 'schema_mode' need \"mode\": \"json\"")
        if (self.tools is not None or self.tool_choice is not None) and self.mode != "tool":
            raise ValueError("'tools' and 'tool_choice' need \"mode\": \"tool\"")
        choice = self.tool_choice
        if isinstance(choice, str) and choice not in ("auto", "required", "none"):
            raise ValueError("tool_choice must be 'auto', 'required', 'none' or {\"name\": TOOL}")
        if isinstance(choice, dict) and (set(choice) != {"name"} or not isinstance(choice["name"], str)):
            raise ValueError("tool_choice must be 'auto', 'required', 'none' or {\"name\": TOOL}")
        return self


@dataclass(slots=True)
class Job:
    """One input line: its conversation (``spec``) or why it cannot run (``error``), and its records."""

    line: int
    id: str | int | None
    spec: BatchLine | None = None
    error: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[Attachment] = field(default_factory=list)  # read when the line is, for its first turn
    done: bool = False
    failed: bool = False


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _load_json_line(raw: str) -> Any:
    """``json.loads`` that raises ValueError (with a short reason) for everything RFC 8259 does not allow
    or that Python cannot hold: NaN/Infinity, lone surrogates, huge integers, absurd nesting."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ValueError(str(exc).split(":")[0]) from None
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    return data


def _where(loc: tuple[Any, ...]) -> str:
    """A validation error's location as the user wrote it: ``turns[2]``, not ``turns.2``; the tags that
    pydantic adds for union members (``id.str``, ``schema.bool``) are dropped."""
    if not loc:
        return ""
    return str(loc[0]) + "".join(f"[{part}]" for part in loc[1:] if isinstance(part, int))


def parse_lines(text: str, base: Path | None = None) -> list[Job]:
    """One job per non-blank line; invalid lines become jobs that carry their error. Attachments are read
    here, relative to ``base`` (the input file's folder; None: the working directory), so a file that
    cannot be attached fails its line before anything runs."""
    jobs: list[Job] = []
    seen: set[str] = set()
    # Lines end at "\n" only: U+2028 or NEL inside a JSON string must not split a line.
    for lineno, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        job = Job(lineno, None)
        jobs.append(job)
        try:
            data = _load_json_line(raw)
        except ValueError as exc:
            job.error = f"line {lineno}: invalid JSON: {exc}"
            continue
        if not isinstance(data, dict):
            job.error = f"line {lineno}: expected a JSON object, got {type(data).__name__}"
            continue
        if type(data.get("id")) in (str, int):
            job.id = data["id"]
        try:
            job.spec = BatchLine.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = _where(tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            if where == "id" and err["type"] in ("string_type", "int_type"):
                msg = "must be a string or an integer"
            job.error = f"line {lineno}{id_note(job)}: " + (f"{where}: {msg}" if where else msg)
            continue
        key = str(job.spec.id)
        if key in seen:
            job.error = f"line {lineno}{id_note(job)}: duplicate id"
            job.spec = None
        seen.add(key)
        if job.spec is not None and job.spec.attachments:
            _read_attachments(job, job.spec.attachments, base or Path())
    return jobs


def _read_attachments(job: Job, names: list[str], base: Path) -> None:
    try:
        job.attachments = [read_attachment(base / name, name) for name in names]
    except AttachmentError as exc:
        job.error = f"line {job.line}{id_note(job)}: attachments: {exc}"
        job.spec = None


def check_session_names(jobs: list[Job], save_dir: Path) -> None:
    """With ``--save-sessions``: two ids that map to one file name would overwrite each other's
    session; the later line fails instead."""
    taken: dict[Path, Job] = {}
    for job in jobs:
        if job.spec is None:
            continue
        path = session_path(save_dir, str(job.spec.id))
        first = taken.setdefault(path, job)
        if first is not job:
            job.error = (
                f"line {job.line}{id_note(job)}: its session file {path.name} would overwrite the one of "
                f"line {first.line}{id_note(first)}; use ids that differ in letters or digits"
            )
            job.spec = None


def id_note(job: Job) -> str:
    return f" (id {job.id!r})" if job.id is not None else ""


def read_input(source: str) -> str:
    """The whole input as text: UTF-8 (a byte-order mark is dropped). Raises RadixchatError."""
    where = "stdin" if source == "-" else f"batch file {source}"
    try:
        if source == "-":
            if sys.stdin is None:
                raise RadixchatError("cannot read stdin: it is closed")
            data = sys.stdin.buffer.read()
        else:
            data = Path(source).read_bytes()
        return data.decode("utf-8-sig")
    except FileNotFoundError:
        raise RadixchatError(f"batch file not found: {source}") from None
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise RadixchatError(f"cannot read {where}: line {line} is not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise RadixchatError(f"cannot read {where}: {exc.strerror or exc}") from None
