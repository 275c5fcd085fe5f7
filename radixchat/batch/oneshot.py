"""``radixchat -p PROMPT``: one prompt, its reply streamed to stdout, then exit.

The shell's way in, as ``ollama run MODEL "question"`` and ``llm "question"`` are. It is a batch run of one
line with one turn, through batch mode's own parts: the backend (``process.open_backend``), the line's
plan (``runner.plan_line``: the settings' system prompt, sampling and model, the JSON constraint), the
reply (``runner.start_reply``) and the exit codes; only the output differs, the reply's text as it
streams instead of a JSON record. So ``-p`` replies what a batch line with the same prompt replies.

With ``-c`` (``--continue``) the line continues the session saved last (``chat.session.latest_session``),
as a batch line's ``"session"`` does, and the finished turn is saved back into it (file, then KV), so the
app and the next ``-c`` see it.

stdout carries the reply and nothing else (one final newline added); stderr the errors, one line each,
and, on a terminal only, what is loading. Exit codes (``radixchat.exit_codes``): 0 the reply finished
(or reached ``--max-tokens`` in chat mode), 1 the reply failed (it does not fit the context, the engine
or server failed, a JSON reply was cut short, stdout was closed), 2 usage (empty prompt, bad schema
file, a file that cannot be attached), 3 the model failed to load, 130 Ctrl-C (what was printed stays),
143 SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from radixchat.batch.input import BatchLine, read_input
from radixchat.batch.process import Stopper, open_backend
from radixchat.batch.process import say as error
from radixchat.batch.runner import Plan, plan_line, start_reply
from radixchat.chat.attachments import compose_message, read_attachment
from radixchat.chat.backend import ChatBackend, Reply, TurnResult
from radixchat.chat.schema_check import schema_errors
from radixchat.chat.thinking import ThinkingDelta
from radixchat.chat.tools import ToolRegistry
from radixchat.config import Settings
from radixchat.errors import RadixchatError
from radixchat.exit_codes import ExitCode, signal_exit_code


@dataclass(frozen=True, slots=True)
class OneShotOptions:
    prompt: str  # the question, or "-" for all of stdin
    json: bool = False  # constrain the reply to a JSON object
    schema: Path | None = None  # constrain it to this JSON Schema (implies json)
    attach: tuple[Path, ...] = ()  # files put into the prompt, before its text (``-a``)
    session: Path | None = None  # continue this saved session and save the turn back (``-c``)
    show_thinking: bool = False  # a thinking model's thinking to stderr (``--show-thinking``)


def read_prompt(text: str, stdin: IO[str] | None) -> str:
    """The prompt: with ``-``, all of stdin; else ``text``, after what is piped in (stdin not a terminal),
    with a blank line between. Trailing whitespace of piped text is dropped (a file's final newline is
    not part of the question). Raises RadixchatError, an empty prompt included."""
    if text == "-":
        prompt = read_input("-").rstrip()
        if not prompt.strip():
            raise RadixchatError("-p -: stdin is empty, so there is no prompt")
        return prompt
    if not text.strip():
        raise RadixchatError("-p: the prompt is empty")
    piped = read_input("-").rstrip() if stdin is not None and not stdin.isatty() else ""
    return f"{piped}\n\n{text}" if piped.strip() else text


def read_schema(path: Path) -> dict[str, Any] | bool:
    """``--schema FILE``: a JSON Schema (an object, or true/false), checked against its metaschema before
    the model loads. Raises RadixchatError (one line)."""
    import jsonschema

    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise RadixchatError(f"--schema: file not found: {path}") from None
    except UnicodeDecodeError:
        raise RadixchatError(f"--schema {path}: not UTF-8 text") from None
    except OSError as exc:
        raise RadixchatError(f"--schema: cannot read {path}: {exc.strerror or exc}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RadixchatError(
            f"--schema {path}: invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    if not isinstance(schema, (dict, bool)):
        kind = type(schema).__name__
        raise RadixchatError(f"--schema {path}: a JSON Schema is an object (or true/false), not a {kind}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "#" + "".join(f"/{p}" for p in exc.absolute_path)
        raise RadixchatError(f"--schema {path}: not a valid JSON Schema at {where}: {exc.message}") from None
    return schema


def run_oneshot(settings: Settings, options: OneShotOptions) -> int:
    """Entry point from the CLI. ModelLoadError propagates (exit 3)."""
    try:
        prompt = read_prompt(options.prompt, sys.stdin)
        schema = read_schema(options.schema) if options.schema is not None else None
        prompt = compose_message(prompt, [read_attachment(path) for path in options.attach])
    except RadixchatError as exc:
        error(str(exc))
        return ExitCode.USAGE
    json_mode = options.json or options.schema is not None
    # A continued session's mode is not kept: -p replies in chat mode unless --json or --schema says so.
    line = BatchLine(
        id="prompt",
        turns=[prompt],
        mode="json" if json_mode else "chat",
        json_schema=schema,
        session=str(options.session) if options.session is not None else None,
    )
    return asyncio.run(_run(settings, line, options))


class Status:
    """One transient line on stderr while the model loads and the prompt is read, erased before the reply
    prints; only when stderr is a terminal (a log or a pipe gets nothing)."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.tty = stream is not None and stream.isatty()
        self.shown = False

    def show(self, text: str) -> None:
        if self.tty and self.stream is not None:
            self.stream.write(f"\r\x1b[K{text}…")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        if self.shown and self.stream is not None:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False


class Thoughts:
    """``--show-thinking``: the thinking on stderr as it streams (dimmed on a terminal), one line break
    after it; stdout keeps the answer alone."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.tty = stream is not None and stream.isatty()
        self.open = False

    def write(self, text: str) -> None:
        if self.stream is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(f"\x1b[2m{text}\x1b[0m" if self.tty else text)
            self.stream.flush()
            self.open = True

    def end(self) -> None:
        if self.open and self.stream is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write("\n")
                self.stream.flush()
        self.open = False


class Stdout:
    """The reply's text, flushed as it comes; remembers whether it ends a line, and a write that failed
    (a closed pipe, as in ``| head -c 100``), after which it writes nothing."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.written = False
        self.at_line_start = True
        self.error: OSError | None = None

    def write(self, text: str) -> None:
        if not text or self.error is not None:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError as exc:
            self.error = exc
            # Nothing more can reach it; keep Python from failing again at exit.
            with contextlib.suppress(OSError, ValueError):
                sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            return
        self.written = True
        self.at_line_start = text.endswith("\n")

    def end_line(self) -> None:
        """The final newline (an empty reply prints an empty line, so ``$(...)`` and ``read`` behave)."""
        if not self.written or not self.at_line_start:
            self.write("\n")


async def _run(settings: Settings, line: BatchLine, options: OneShotOptions) -> int:
    stopper = Stopper()
    stopper.catch_signals()
    status, out = Status(sys.stderr), Stdout(sys.stdout)
    backend: ChatBackend | None = None
    reply: Reply | None = None
    try:
        backend = await open_backend(settings, status.show, lambda text: (status.clear(), error(text)))
        if line.mode == "json":
            status.show("compiling the JSON constraint")
        try:
            plan = await plan_line(backend, settings, ToolRegistry(), line)
        except RadixchatError as exc:  # a schema the constraint cannot enforce
            status.clear()
            error(f"--schema {options.schema}: {exc}" if options.schema is not None else str(exc))
            return ExitCode.USAGE
        status.show("reading the prompt")
        try:
            reply = await start_reply(backend, plan, line.turns[0])
        except RadixchatError as exc:  # it does not fit the context, or the engine refuses it
            status.clear()
            error(str(exc))
            return ExitCode.FAILED
        thoughts = Thoughts(sys.stderr) if options.show_thinking else None
        async for text in reply:
            status.clear()
            if isinstance(text, ThinkingDelta):
                if thoughts is not None:
                    thoughts.write(text)
                continue
            if thoughts is not None:
                thoughts.end()
            out.write(text)
            if out.error is not None:
                reply.cancel()
        if thoughts is not None:
            thoughts.end()
        result = await reply.result()
        if options.session is not None and out.error is None:
            await _save_back(backend, plan, result, options.session.parent)
    except asyncio.CancelledError:
        if stopper.by is None:
            raise
        if reply is not None:
            reply.cancel()
        status.clear()
        if out.written:
            out.end_line()  # what was printed stays, and the shell's prompt starts on its own line
        error(f"interrupted ({signal.Signals(stopper.by).name})")
        return signal_exit_code(stopper.by)
    finally:
        stopper.release_signals()
        status.clear()
        if backend is not None:
            await backend.aclose()
    out.end_line()
    if out.error is not None:
        error(f"cannot write the output: {out.error.strerror or out.error}")
        return ExitCode.FAILED
    return _outcome(result, line, settings)


async def _save_back(backend: ChatBackend, plan: Plan, result: TurnResult, folder: Path) -> None:
    """``-c -p``: the continued session with the new turn, saved as the app saves it (its file, then
    the KV of its tokens, so the app reopens it warm). A failed or cut-off JSON reply is not saved."""
    if plan.base is None or result.finish_reason in ("error", "cancelled"):
        return
    if plan.mode == "json" and result.finish_reason == "length":
        return
    session = plan.session_file(plan.conv, plan.base.name)
    try:
        saved = await asyncio.to_thread(plan.write, session, folder, backend, plan.conv.ids)
    except OSError as exc:
        error(f"the reply was not saved to session {session.name!r}: {exc.strerror or exc}")
        return
    if saved.kv_notice:
        error(f"session {session.name!r} saved; {saved.kv_notice}")


def _outcome(result: TurnResult, line: BatchLine, settings: Settings) -> int:
    """The exit code of a finished reply, with a line on stderr for anything short of a clean end."""
    if result.finish_reason in ("error", "cancelled"):
        error(result.error or f"the reply was {result.finish_reason}")
        return ExitCode.FAILED
    cut = result.finish_reason == "length"
    if line.mode == "json":
        if cut:
            error(f"the reply reached --max-tokens ({settings.max_tokens}), so its JSON is incomplete")
            return ExitCode.FAILED
        # The grammar guarantees the schema here; a remote server's own constraint may not.
        problems = schema_errors(line.json_schema, result.message.content)
        if problems:
            error(f"the reply breaks the schema: {problems[0]}")
            return ExitCode.FAILED
    elif cut and sys.stderr is not None and sys.stderr.isatty():
        error(f"the reply stopped at --max-tokens ({settings.max_tokens})")
    return ExitCode.OK
