"""The batch process: check the input and targets, load the backend (starting the MCP servers meanwhile),
run every line, and end with the right exit code whatever happens (Ctrl-C and SIGTERM save what
completed; a broken output stops the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path

from radixchat.batch.input import Job, check_session_names, parse_lines, read_input
from radixchat.batch.options import BatchOptions
from radixchat.batch.output import Progress, Writer, check_targets, close_output, open_output, summary
from radixchat.batch.runner import BatchRunner
from radixchat.chat.backend import ChatBackend
from radixchat.chat.loading import Progress as LoadProgress
from radixchat.chat.loading import load_backend
from radixchat.chat.mcp_client import McpTools
from radixchat.chat.tools import ToolRegistry
from radixchat.config import Settings
from radixchat.errors import RadixchatError
from radixchat.exit_codes import ExitCode, signal_exit_code


def run_batch(settings: Settings, options: BatchOptions) -> int:
    """Entry point from the CLI. ModelLoadError propagates (exit 3)."""
    try:
        text = read_input(options.source)
        registry = ToolRegistry.from_config(settings.tools)
        for problem in registry.problems:
            print(f"radixchat: {problem} (the tool is left out)", file=sys.stderr)
        # MCP tools are listed only once their servers run: their names are checked by server here.
        servers = tuple(f"{s.name}_" for s in settings.mcp_servers)
        allow = options.allow_tools
        unknown = sorted(
            n
            for n in allow
            if (n not in registry.tools or registry.tools[n].builtin) and not n.startswith(servers)
        )
        if unknown:
            raise RadixchatError(
                f"--allow-tools: {unknown[0]!r} is not a user tool from the config file or an MCP server's"
            )
    except RadixchatError as exc:
        print(f"radixchat: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    jobs = parse_lines(text, None if options.source == "-" else Path(options.source).parent)
    if not jobs:
        print("radixchat: the batch input has no conversations", file=sys.stderr)
        return ExitCode.USAGE
    try:
        check_targets(options)
    except RadixchatError as exc:
        print(f"radixchat: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if options.save_sessions is not None:
        check_session_names(jobs, options.save_sessions)
    return asyncio.run(_run_all(settings, jobs, options, registry))


async def _run_all(settings: Settings, jobs: list[Job], options: BatchOptions, registry: ToolRegistry) -> int:
    started = time.perf_counter()
    stopper = Stopper()
    stopper.catch_signals()
    backend = out = None
    mcp = McpTools(settings.mcp_servers, registry, settings.cache_dir)
    try:
        # The MCP servers start while the model loads; a server that fails is a line on stderr.
        mcp_started = asyncio.create_task(
            mcp.start(lambda text: print(f"radixchat: {text}", file=sys.stderr))
        )
        backend = await open_backend(settings)
        await mcp_started
        out = open_output(options.output)  # only now: a model that fails to load leaves the file as it was
        writer = Writer(out, jobs, options.ordered, on_error=lambda: stopper.stop(0))
        progress = Progress(sum(len(j.spec.turns) for j in jobs if j.spec))
        runner = BatchRunner(
            backend, settings, writer, progress, options.save_sessions, registry, options.allow_tools
        )
        try:
            await asyncio.gather(*(runner.run_job(j) for j in jobs))
        finally:
            progress.close()
    except asyncio.CancelledError:
        if stopper.by is None:
            raise
    finally:
        stopper.release_signals()
        await mcp.aclose()
        if backend is not None:
            await backend.aclose()
        if out is not None:
            if stopper.by:
                writer.flush_all()
            close_output(out, writer)
    if out is not None and writer.error is not None:
        print(f"radixchat: cannot write the output: {writer.error.strerror or writer.error}", file=sys.stderr)
        return ExitCode.FAILED
    if stopper.by:
        name = signal.Signals(stopper.by).name
        print(f"radixchat: interrupted ({name}); completed turns were written", file=sys.stderr)
        return signal_exit_code(stopper.by)
    assert backend is not None
    done = f"{len(jobs)} conversations, {runner.turns} turns, {summary(backend.totals(), started)}"
    print(f"radixchat: {done}", file=sys.stderr)
    return ExitCode.FAILED if any(j.failed for j in jobs) else ExitCode.OK


def say(msg: str) -> None:
    print(f"radixchat: {msg}", file=sys.stderr, flush=True)


async def open_backend(
    settings: Settings, progress: LoadProgress = lambda _: None, notice: LoadProgress = say
) -> ChatBackend:
    """The in-process engine (loaded and started), or the remote server named by ``backend`` (its model
    checked); ``progress`` hears each step (from the loading thread), ``notice`` each of the backend's
    load-time notices (a chat template chosen for the model). Failures raise ModelLoadError (exit 3)."""
    backend = await asyncio.to_thread(load_backend, settings, progress)
    for text in backend.notices:
        notice(text)
    await backend.start()
    return backend


class Stopper:
    """Ends a run in order: Ctrl-C or SIGTERM (between ``catch_signals`` and ``release_signals``), or the
    run itself (``stop(0)``: its output broke), cancels the task that made it, once, instead of raising
    KeyboardInterrupt wherever the code happens to be. ``by`` says what stopped it."""

    # Stopped by these, a run ends with what completed and 128 + the signal (``signal_exit_code``).
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        task = asyncio.current_task()
        assert task is not None, "made on the event loop, by the run's task"
        self.task = task
        self.by: int | None = None  # the signal number, or 0 when the output broke

    def stop(self, signum: int) -> None:
        if self.by is None:
            self.by = signum
            self.task.cancel()

    def catch_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in self.SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, self.stop, signum)

    def release_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in self.SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)
