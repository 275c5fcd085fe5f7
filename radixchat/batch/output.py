"""Batch output: one JSON Lines record per turn, written and flushed as it finishes (or in input order),
the progress line on a terminal, and the checks of the output targets before the model loads.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from radixchat.batch.input import Job
from radixchat.batch.options import BatchOptions
from radixchat.chat.backend import TurnResult
from radixchat.chat.tool_turn import ToolTurn
from radixchat.chat.usage import UsageTotals
from radixchat.errors import RadixchatError


def record(
    job: Job,
    turn: int | None,
    result: TurnResult | None = None,
    error: str | None = None,
    tool_turn: ToolTurn | None = None,
    schema_errors: list[str] | None = None,
) -> dict[str, Any]:
    if tool_turn is not None:
        result = tool_turn.final
    first = tool_turn.rounds[0] if tool_turn is not None else result
    return {
        "id": job.id,
        "line": job.line,
        "turn": turn,
        "reply": (tool_turn.text if tool_turn is not None else result.message.content) if result else None,
        # A thinking model's thinking (null: it did not think).
        "reasoning": (tool_turn.reasoning if tool_turn is not None else result.message.reasoning)
        if result
        else None,
        "finish_reason": result.finish_reason if result else "error",
        "usage": (tool_turn.usage() if tool_turn is not None else result.usage()) if result else None,
        "ttft_ms": round(first.ttft_ms, 2) if first and first.ttft_ms is not None else None,
        "decode_tokens_per_s": (
            round(result.decode_tokens_per_s, 2)
            if result and result.decode_tokens_per_s is not None
            else None
        ),
        "tool_calls": [c.as_dict() for c in tool_turn.calls] if tool_turn is not None else [],
        "tool_notes": tool_turn.notes if tool_turn is not None else [],
        "schema_errors": schema_errors,
        "dropped_turns": (
            sum(r.dropped_turns for r in tool_turn.rounds) if tool_turn is not None else result.dropped_turns
        )
        if result
        else 0,
        "error": error if error is not None else (result.error if result else None),
    }


class Writer:
    """Writes records as they finish (or in input order with ``ordered``), flushing every line."""

    def __init__(
        self, out: IO[str], jobs: list[Job], ordered: bool, on_error: Callable[[], None] = lambda: None
    ) -> None:
        self.out, self.jobs, self.ordered = out, jobs, ordered
        self.on_error = on_error  # called once when the output cannot be written (disk full, closed pipe)
        self.error: OSError | None = None
        self._next_job = 0
        self._written: dict[int, int] = {}  # job index -> records written

    def add(self, job: Job, rec: dict[str, Any]) -> None:
        job.records.append(rec)
        if not self.ordered:
            self._write(rec)
        else:
            self._drain()

    def finish(self, job: Job) -> None:
        job.done = True
        if self.ordered:
            self._drain()

    def flush_all(self) -> None:
        """On interrupt: everything completed so far, in order."""
        for i, job in enumerate(self.jobs):
            for rec in job.records[self._written.get(i, 0) :] if self.ordered else []:
                self._write(rec)

    def _drain(self) -> None:
        while self._next_job < len(self.jobs):
            i = self._next_job
            job = self.jobs[i]
            done = self._written.get(i, 0)
            for rec in job.records[done:]:
                self._write(rec)
            self._written[i] = len(job.records)
            if not job.done:
                return
            self._next_job += 1

    def _write(self, rec: dict[str, Any]) -> None:
        if self.error is not None:
            return
        try:
            self.out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.out.flush()
        except OSError as exc:
            self.error = exc
            self.on_error()


class Progress:
    """A single updating line on a terminal; silent otherwise."""

    def __init__(self, total_turns: int, stream: IO[str] | None = None) -> None:
        # sys.stderr is looked up now, not at import (it may have been replaced since).
        self.total, self.done, self.stream = total_turns, 0, stream or sys.stderr
        self.tty = self.stream.isatty()

    def turn_done(self) -> None:
        self.done += 1
        if self.tty:
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            bar = "█" * filled + "·" * (width - filled)
            self.stream.write(f"\r{bar} {self.done}/{self.total} turns")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self.done:
            self.stream.write("\n")
            self.stream.flush()


def open_output(target: str | None) -> IO[str]:
    """stdout (no target, or ``-``), else the file, truncated now. Raises RadixchatError."""
    if not target or target == "-":
        return sys.stdout
    try:
        return open(target, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise RadixchatError(f"cannot write {target}: {exc.strerror or exc}") from None


def check_targets(options: BatchOptions) -> None:
    """Before the model loads: the output file and the sessions folder must be writable (nothing is
    truncated yet — the output is opened once the model is ready). Raises RadixchatError."""
    if options.output and options.output != "-":
        out = Path(options.output)
        if out.is_dir():
            raise RadixchatError(f"cannot write {out}: it is a folder")
        folder = out.parent if str(out.parent) else Path(".")
        if not folder.is_dir():
            raise RadixchatError(f"cannot write {out}: folder {folder} does not exist")
        if not os.access(out if out.exists() else folder, os.W_OK):
            raise RadixchatError(f"cannot write {out}: permission denied")
    if options.save_sessions is not None:
        try:
            options.save_sessions.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RadixchatError(
                f"--save-sessions: cannot create {options.save_sessions}: {exc.strerror}"
            ) from None
        if not os.access(options.save_sessions, os.W_OK):
            raise RadixchatError(
                f"--save-sessions: cannot write in {options.save_sessions}: permission denied"
            )


def close_output(out: IO[str], writer: Writer) -> None:
    try:
        if out is sys.stdout:
            out.flush()
        else:
            out.close()
    except OSError as exc:  # the last buffered bytes did not fit (disk full)
        writer.error = writer.error or exc
    if writer.error is not None and out is sys.stdout:
        # Nothing more can reach a broken stdout; keep Python from failing again at exit.
        with contextlib.suppress(OSError, ValueError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115


def summary(totals: UsageTotals, started: float) -> str:
    """The run in one line: tokens, cache use, time and speed."""
    wall = time.perf_counter() - started
    prompt, generated = totals.prompt_tokens, totals.completion_tokens
    cached = f"{totals.hit_rate:.1%} cached" if totals.hit_rate is not None else "cache use not reported"
    return f"{prompt} prompt tokens ({cached}), {generated} generated, {wall:.1f} s, {generated / wall:.1f} tok/s"
