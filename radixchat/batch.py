"""``radixchat --batch FILE``: headless conversations from JSON Lines, results as JSON Lines.

Every conversation runs concurrently through the engine's continuous batching (turns of one conversation
in order). A record is written and flushed as soon as its turn finishes, so a killed run keeps everything
completed; ``--ordered`` writes records in input order instead. Bad lines yield an error record naming the
line and id; the other lines still run. Exit codes: 0 all ok, 1 some conversation failed, 2 usage error,
3 model failed to load (or the remote server cannot be used), 130 interrupted (143 on SIGTERM). With ``--backend URL`` the
conversations run on an OpenAI-compatible server instead (see docs/remote.md); a conversation the server
fails gets an error record and the others go on. This module never imports Textual.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from radixchat.chat.backend import ChatBackend, LocalBackend, TurnResult, sampling_params
from radixchat.chat.conversation import Conversation
from radixchat.chat.loading import load_backend, start_backend
from radixchat.chat.modes import grammar_for
from radixchat.chat.schema_check import schema_errors
from radixchat.chat.session import (
    SamplingSettings,
    SessionFile,
    conversation_from_session,
    load_session,
    save_session,
    session_from_conversation,
    session_path,
)
from radixchat.chat.tool_turn import ToolTurn, run_tool_turn
from radixchat.chat.tools import Tool, ToolContext, ToolRegistry, allow_listed
from radixchat.config import Settings
from radixchat.engine import SamplingParams
from radixchat.errors import RadixchatError

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


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
    line: int
    id: str | int | None
    spec: BatchLine | None = None
    error: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    failed: bool = False


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
        "finish_reason": result.finish_reason if result else "error",
        "usage": (tool_turn.usage() if tool_turn is not None else result.usage()) if result else None,
        "ttft_ms": round(first.ttft_ms, 2) if first and first.ttft_ms is not None else None,
        "decode_tokens_per_s": (
            round(result.decode_tokens_per_s, 2)
            if result and result.decode_tokens_per_s is not None
            else None
        ),
        "tool_calls": [c.as_dict() for c in tool_turn.calls] if tool_turn is not None else [],
        "schema_errors": schema_errors,
        "error": error if error is not None else (result.error if result else None),
    }


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


def parse_lines(text: str) -> list[Job]:
    """One job per non-blank line; invalid lines become jobs that carry their error."""
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
            job.error = f"line {lineno}{_id_note(job)}: " + (f"{where}: {msg}" if where else msg)
            continue
        key = str(job.spec.id)
        if key in seen:
            job.error = f"line {lineno}{_id_note(job)}: duplicate id"
            job.spec = None
        seen.add(key)
    return jobs


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
                f"line {job.line}{_id_note(job)}: its session file {path.name} would overwrite the one of "
                f"line {first.line}{_id_note(first)}; use ids that differ in letters or digits"
            )
            job.spec = None


def _id_note(job: Job) -> str:
    return f" (id {job.id!r})" if job.id is not None else ""


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


def sampling_for(
    spec: BatchLine, settings: Settings, saved: SamplingSettings | None = None
) -> SamplingParams:
    """Line values win over the saved session's, which win over the settings' defaults."""
    names = ("max_tokens", "temperature", "top_p", "top_k", "repetition_penalty", "seed")
    overrides = saved.model_dump() if saved is not None else {}
    overrides.update({n: getattr(spec, n) for n in names if getattr(spec, n) is not None})
    return sampling_params(settings, stop=spec.stop or (), **{n: overrides.get(n) for n in names})


@dataclass
class Plan:
    """How one conversation runs, resolved from its line, its saved session and the settings."""

    conv: Conversation
    params: SamplingParams
    mode: str
    schema: Any = None
    tools: list[Tool] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    ctx: ToolContext = field(default_factory=ToolContext)
    saved: SessionFile | None = None
    lenient: bool = False


class BatchRunner:
    def __init__(
        self,
        backend: ChatBackend,
        settings: Settings,
        writer: Writer,
        progress: Progress,
        save_dir: Path | None,
        allow_tools: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.writer = writer
        self.progress = progress
        self.save_dir = save_dir
        self.registry = ToolRegistry.from_config(settings.tools)
        self.consent = allow_listed(set(allow_tools))
        self.turns = 0

    async def run_job(self, job: Job) -> None:
        try:
            await self._run(job)
        finally:
            self.writer.finish(job)

    async def _plan(self, spec: BatchLine) -> Plan:
        saved = None
        if spec.session is not None:
            saved = load_session(Path(spec.session), expect_model=self.backend.model_name)
            conv = conversation_from_session(saved, self.backend.fmt, self.backend.model_name)
        else:
            system = spec.system if spec.system is not None else self.settings.system_prompt
            conv = self.backend.new_conversation(system=system)
        explicit = spec.model_fields_set
        mode = saved.mode if saved is not None and "mode" not in explicit else spec.mode
        plan = Plan(
            conv, sampling_for(spec, self.settings, saved.sampling if saved else None), mode, saved=saved
        )
        plan.ctx.notes = saved.notes if saved is not None else ""
        if mode == "json":
            plan.schema = (
                spec.json_schema if spec.json_schema is not None or saved is None else saved.json_schema
            )
            plan.lenient = spec.schema_mode == "lenient"
        if mode == "tool":
            names = (
                spec.tools if spec.tools is not None else (saved.tools or None if saved is not None else None)
            )
            plan.tools = self.registry.select(names)
            plan.tool_choice = spec.tool_choice if spec.tool_choice is not None else "auto"
        # Compiling checks the schema / tools before any turn runs; each turn gets a fresh matcher.
        decls = [t.schema() for t in plan.tools] or None
        await asyncio.to_thread(
            grammar_for, self.backend, mode, plan.schema, decls, plan.tool_choice, plan.lenient
        )
        return plan

    async def _run(self, job: Job) -> None:
        spec = job.spec
        if spec is None:
            job.failed = True
            self.writer.add(job, record(job, None, error=job.error))
            return
        try:
            plan = await self._plan(spec)
        except RadixchatError as exc:
            job.failed = True
            self.writer.add(job, record(job, None, error=f"line {job.line}{_id_note(job)}: {exc}"))
            return
        kept, written = len(plan.conv.messages), 0  # messages and records of the completed turns
        try:
            for turn, text in enumerate(spec.turns):
                try:
                    result, tool_turn = await self._turn(plan, text)
                except RadixchatError as exc:
                    job.failed = True
                    self.writer.add(
                        job, record(job, turn, error=f"line {job.line}{_id_note(job)} turn {turn}: {exc}")
                    )
                    break
                self.turns += 1
                self.progress.turn_done()
                if result.finish_reason == "error":
                    job.failed = True
                errors = None
                if plan.mode == "json" and result.finish_reason != "error":
                    errors = schema_errors(plan.schema, result.message.content)
                self.writer.add(job, record(job, turn, result, tool_turn=tool_turn, schema_errors=errors))
                written += 1
                if result.finish_reason == "error":
                    break  # the failed turn is in the record, not in the session to continue
                kept = len(plan.conv.messages)
                if result.finish_reason == "cancelled":
                    break
        except asyncio.CancelledError:
            # Interrupted: the turns already written are saved too, without the one in flight.
            if self.save_dir is not None and written:
                plan.conv = plan.conv.truncated(kept)
                self._save(job, spec, plan)
            raise
        if self.save_dir is not None:
            plan.conv = plan.conv.truncated(kept)  # without a failed turn (its user message included)
            self._save(job, spec, plan)

    async def _turn(self, plan: Plan, text: str) -> tuple[TurnResult, ToolTurn | None]:
        if plan.mode == "tool":
            tool_turn = await run_tool_turn(
                self.backend,
                plan.conv,
                text,
                plan.params,
                plan.tools,
                self.registry,
                plan.ctx,
                self.consent,
                tool_choice=plan.tool_choice,
                max_rounds=self.settings.max_tool_rounds,
            )
            return tool_turn.final, tool_turn
        plan.conv.add_user(text)
        grammar = await asyncio.to_thread(
            grammar_for, self.backend, plan.mode, plan.schema, lenient=plan.lenient
        )
        return await self.backend.reply(plan.conv, plan.params, grammar).result(), None

    def _save(self, job: Job, spec: BatchLine, plan: Plan) -> None:
        name = str(spec.id)
        # A continued session keeps its sampling settings; the line's own values win over them.
        kept = plan.saved.sampling.model_dump() if plan.saved is not None else {}
        given = {n: getattr(spec, n) for n in SamplingSettings.model_fields if getattr(spec, n) is not None}
        sampling = SamplingSettings(**{**kept, **given})
        session = session_from_conversation(
            plan.conv,
            name=name,
            model=self.backend.model_name,
            mode=plan.mode,
            base=plan.saved,
            sampling=sampling,
            json_schema=plan.schema,
            tools=[t.name for t in plan.tools],
            notes=plan.ctx.notes,
        )
        try:
            save_session(session, session_path(self.save_dir, name))
        except OSError as exc:
            job.failed = True
            print(f"radixchat: cannot save session {name!r}: {exc}", file=sys.stderr)


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


def open_output(target: str | None) -> IO[str]:
    """stdout (no target, or ``-``), else the file, truncated now. Raises RadixchatError."""
    if not target or target == "-":
        return sys.stdout
    try:
        return open(target, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise RadixchatError(f"cannot write {target}: {exc.strerror or exc}") from None


def check_targets(ns: argparse.Namespace) -> None:
    """Before the model loads: the output file and the sessions folder must be writable (nothing is
    truncated yet — the output is opened once the model is ready). Raises RadixchatError."""
    if ns.output and ns.output != "-":
        out = Path(ns.output)
        if out.is_dir():
            raise RadixchatError(f"cannot write {out}: it is a folder")
        folder = out.parent if str(out.parent) else Path(".")
        if not folder.is_dir():
            raise RadixchatError(f"cannot write {out}: folder {folder} does not exist")
        if not os.access(out if out.exists() else folder, os.W_OK):
            raise RadixchatError(f"cannot write {out}: permission denied")
    if ns.save_sessions is not None:
        try:
            ns.save_sessions.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RadixchatError(
                f"--save-sessions: cannot create {ns.save_sessions}: {exc.strerror}"
            ) from None
        if not os.access(ns.save_sessions, os.W_OK):
            raise RadixchatError(f"--save-sessions: cannot write in {ns.save_sessions}: permission denied")


def run_batch(settings: Settings, ns: argparse.Namespace) -> int:
    """Entry point from the CLI. ModelLoadError propagates (exit 3)."""
    try:
        text = read_input(ns.batch)
    except RadixchatError as exc:
        print(f"radixchat: {exc}", file=sys.stderr)
        return EXIT_USAGE
    allow = {n.strip() for n in (ns.allow_tools or "").split(",") if n.strip()}
    try:
        registry = ToolRegistry.from_config(settings.tools)
        unknown = sorted(n for n in allow if n not in registry.tools or registry.tools[n].builtin)
        if unknown:
            raise RadixchatError(f"--allow-tools: {unknown[0]!r} is not a user tool from the config file")
    except RadixchatError as exc:
        print(f"radixchat: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ns.allow_tools = ",".join(sorted(allow))
    jobs = parse_lines(text)
    if not jobs:
        print("radixchat: the batch input has no conversations", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_targets(ns)
    except RadixchatError as exc:
        print(f"radixchat: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if ns.save_sessions is not None:
        check_session_names(jobs, ns.save_sessions)
    return asyncio.run(_run_all(settings, jobs, ns))


async def _run_all(settings: Settings, jobs: list[Job], ns: argparse.Namespace) -> int:
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    stopped_by: int | None = None  # the signal number, or 0 when the output broke

    def stop(signum: int) -> None:
        nonlocal stopped_by
        if stopped_by is None:
            stopped_by = signum
            main.cancel()

    signals = (signal.SIGINT, signal.SIGTERM)
    for signum in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop, signum)
    backend = out = None
    try:
        backend = await _open_backend(settings)
        out = open_output(ns.output)  # only now: a model that fails to load leaves the file as it was
        writer = Writer(out, jobs, ns.ordered, on_error=lambda: stop(0))
        progress = Progress(sum(len(j.spec.turns) for j in jobs if j.spec))
        allow = {n.strip() for n in (ns.allow_tools or "").split(",") if n.strip()}
        runner = BatchRunner(backend, settings, writer, progress, ns.save_sessions, allow)
        try:
            await asyncio.gather(*(runner.run_job(j) for j in jobs))
        finally:
            progress.close()
    except asyncio.CancelledError:
        if stopped_by is None:
            raise
    finally:
        for signum in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)
        if backend is not None:
            await backend.aclose()
        if out is not None:
            if stopped_by:
                writer.flush_all()
            _close_output(out, writer)
    if out is not None and writer.error is not None:
        print(f"radixchat: cannot write the output: {writer.error.strerror or writer.error}", file=sys.stderr)
        return EXIT_FAILED
    if stopped_by:
        name = signal.Signals(stopped_by).name
        print(f"radixchat: interrupted ({name}); completed turns were written", file=sys.stderr)
        return EXIT_INTERRUPTED if stopped_by == signal.SIGINT else 128 + stopped_by
    print(
        f"radixchat: {len(jobs)} conversations, {runner.turns} turns, {_summary(backend, started)}",
        file=sys.stderr,
    )
    return EXIT_FAILED if any(j.failed for j in jobs) else EXIT_OK


async def _open_backend(settings: Settings) -> ChatBackend:
    """The in-process engine (loaded and started), or the remote server named by ``backend`` (its model
    checked). Failures raise ModelLoadError (exit 3)."""
    backend = await asyncio.to_thread(load_backend, settings)
    await start_backend(backend)
    return backend


def _close_output(out: IO[str], writer: Writer) -> None:
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


def _summary(backend: Any, started: float) -> str:
    wall = time.perf_counter() - started
    if isinstance(backend, LocalBackend):
        stats = backend.engine.stats(tree=False)
        prompt, generated = stats.prompt_tokens, stats.generated_tokens
        cached = f"{stats.hit_rate:.1%} cached"
    else:
        totals = backend.totals
        prompt, generated = totals.prompt_tokens, totals.completion_tokens
        cached = f"{totals.hit_rate:.1%} cached" if totals.hit_rate is not None else "cache use not reported"
    return f"{prompt} prompt tokens ({cached}), {generated} generated, {wall:.1f} s, {generated / wall:.1f} tok/s"
