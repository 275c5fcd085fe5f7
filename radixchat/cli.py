"""The ``radixchat`` command: the chat app by default, ``--batch`` for headless runs, ``-p`` for one prompt.

Every ``Settings`` field is a flag (``--kv-pool-tokens``, ``--no-radix-cache``, ...), generated from the
fields so ``--help`` cannot drift from the code. ``--backend URL`` runs everything on an OpenAI-compatible
server; ``--list-models`` shows what it serves; ``--list-tools`` shows every tool tool mode can offer;
``-c`` continues the session saved last (in the app, or with ``-p``). Exit codes: 0 ok, 1 some
conversation failed (batch), the reply failed (``-p``) or an MCP server failed (``--list-tools``), 2 usage
or configuration error, 3 the model failed to load or the remote server cannot be used, 130 interrupted.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import threading
import types
import typing
from pathlib import Path
from typing import Any

from radixchat import __version__
from radixchat.config import Settings, default_cache_dir
from radixchat.errors import ConfigError, ModelLoadError, RadixchatError
from radixchat.exit_codes import ExitCode
from radixchat.machine import probed_auto_choice

METAVARS = {"preset": "NAME"}  # where the field's last word does not say what the value is


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("settings (also RADIXCHAT_<NAME> env vars and the config file)")
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        origin = typing.get_origin(annotation)
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        default = field.get_default(call_default_factory=True)
        if origin in (list, dict):  # structured settings (user tools, keymap) live in the config file only
            continue
        help_text = field.description if default is None else f"{field.description} (default: {default})"
        if name == "weights" and (choice := probed_auto_choice(default_cache_dir())):
            help_text += f"; auto runs {choice} on this machine"
        if annotation is bool:
            group.add_argument(
                _flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
            continue
        choices = None
        if origin is typing.Literal:
            choices = list(typing.get_args(annotation))
        elif (
            origin in (typing.Union, types.UnionType)
            and args
            and typing.get_origin(args[0]) is typing.Literal
        ):
            choices = list(typing.get_args(args[0]))
        metavar = (
            "{" + ",".join(choices) + "}" if choices else METAVARS.get(name, name.split("_")[-1].upper())
        )
        # Values stay strings here; pydantic validates and converts them, naming the setting on error.
        group.add_argument(_flag(name), dest=name, default=None, metavar=metavar, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixchat",
        description="Terminal LLM chat with an in-process radix-tree KV cache engine.",
        epilog=(
            'Without --batch or -p, radixchat opens the chat app. One prompt: radixchat -p "question"; '
            'cat notes.md | radixchat -p "Summarise this". Exit codes: 0 ok, 1 a reply or conversation '
            "(or an MCP server, --list-tools) failed, 2 usage, 3 the model or server cannot be used, 130 Ctrl-C. "
            "Docs: README.md."
        ),
    )
    parser.add_argument("--version", action="version", version=f"radixchat {__version__}")
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML config file (default: ~/.config/radixchat/config.toml)",
    )
    oneshot = parser.add_argument_group("one-shot prompt (the reply on stdout, then exit)")
    oneshot.add_argument(
        "-p",
        "--prompt",
        metavar="TEXT",
        help="reply to TEXT and exit; text piped to stdin goes before TEXT, after a blank line "
        "('-': the whole prompt is stdin)",
    )
    oneshot.add_argument("--json", action="store_true", help="with -p: the reply is a JSON object")
    oneshot.add_argument(
        "--show-thinking",
        action="store_true",
        help="with -p: stream a thinking model's thinking to stderr (dimmed on a terminal); stdout "
        "carries the answer only",
    )
    oneshot.add_argument(
        "--schema", metavar="FILE", type=Path, help="with -p: the reply matches this JSON Schema file"
    )
    oneshot.add_argument(
        "-a",
        "--attach",
        metavar="FILE",
        type=Path,
        action="append",
        help="with -p: put FILE (text, code or PDF) into the prompt, before its text; repeatable",
    )
    batch = parser.add_argument_group("headless batch mode")
    batch.add_argument(
        "--batch", metavar="FILE", help="run conversations from a JSON Lines file ('-' for stdin)"
    )
    batch.add_argument(
        "--output", "-o", metavar="FILE", help="write JSON Lines results here (default: stdout)"
    )
    batch.add_argument(
        "--ordered", action="store_true", help="write records in input order (default: as each turn finishes)"
    )
    batch.add_argument(
        "--save-sessions", metavar="DIR", type=Path, help="save each finished conversation here"
    )
    batch.add_argument(
        "--allow-tools",
        metavar="NAME,...",
        help="user tools (from the config file) that may run without asking",
    )
    tools = parser.add_argument_group("tools")
    tools.add_argument(
        "--list-tools",
        action="store_true",
        help="print every tool tool mode can offer (built-in, [[tools]], [[mcp_servers]]) and exit; "
        "the MCP servers are started to list theirs (exit 1 if one fails)",
    )
    remote = parser.add_argument_group("remote backend (with --backend URL)")
    remote.add_argument(
        "--list-models", action="store_true", help="print the models the server offers and exit"
    )
    app = parser.add_argument_group("chat app")
    app.add_argument("--session", metavar="NAME", help="open a saved session at start")
    app.add_argument(
        "-c",
        "--continue",
        dest="continue_last",
        action="store_true",
        help="reopen the session saved last (newest file in --sessions-dir); with -p, add the prompt "
        "and its reply to it",
    )
    _add_settings_flags(parser)
    return parser


def settings_from_args(ns: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {
        name: getattr(ns, name) for name in Settings.model_fields if getattr(ns, name, None) is not None
    }
    return Settings.load(overrides, ns.config)


def list_models(settings: Settings) -> int:
    """``--list-models``: one served model id per line (BackendUnavailableError → exit 3)."""
    if settings.backend == "local":
        error("--list-models needs --backend URL (an OpenAI-compatible server)")
        return ExitCode.USAGE
    import asyncio

    from radixchat.chat.remote import RemoteBackend

    for model in asyncio.run(RemoteBackend.from_settings(settings).list_models()):
        print(model)
    return ExitCode.OK


def configure_logging(settings: Settings, interactive: bool) -> None:
    """Warnings and engine errors: to stderr in batch mode, to ``<cache_dir>/radixchat.log`` in the app
    (anything written to the terminal would garble the screen). transformers' own chatter stays off."""
    import logging
    import logging.handlers
    import os

    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    level = logging.DEBUG if settings.debug else logging.WARNING
    handler: logging.Handler
    if interactive:
        try:
            settings.cache_dir.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                settings.cache_dir / "radixchat.log", maxBytes=2_000_000, backupCount=2, encoding="utf-8"
            )
        except OSError:
            handler = logging.NullHandler()
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("transformers", "httpx", "openai"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def check_local_engine_settings(settings: Settings) -> None:
    """A weights format this machine cannot run is a usage error before anything loads (needs torch, so only
    for an explicit compact format)."""
    if settings.backend != "local" or settings.weights in ("auto", "float32"):
        return
    import torch

    from radixchat.engine.weights import check_weights_format

    device = (
        "cuda"
        if settings.device == "cuda" or (settings.device == "auto" and torch.cuda.is_available())
        else "cpu"
    )
    check_weights_format(settings.weights, torch.device(device))


def flag_conflict(ns: argparse.Namespace) -> str | None:
    """Flags given together that cannot be (one line), or None."""
    if ns.list_tools and (ns.prompt is not None or ns.batch is not None or ns.list_models):
        return "--list-tools lists the tools and exits; it cannot be used with -p, --batch or --list-models"
    if ns.prompt is not None and ns.batch is not None:
        return "-p and --batch cannot be used together (a batch line holds its own prompts)"
    if ns.batch is None and (ns.output or ns.ordered or ns.save_sessions or ns.allow_tools):
        return "--output, --ordered, --save-sessions and --allow-tools need --batch"
    if ns.prompt is None and (ns.json or ns.schema is not None):
        return '--json and --schema need -p (in batch mode a line says "mode": "json" and its "schema")'
    if ns.prompt is None and ns.show_thinking:
        return '--show-thinking needs -p (batch records carry the thinking as "reasoning")'
    if ns.prompt is None and ns.attach:
        return '--attach needs -p (in batch mode a line lists its "attachments"; in the chat app type @FILE)'
    if ns.prompt is not None and ns.session is not None:
        return "--session opens a session in the chat app; it cannot be used with -p"
    if ns.continue_last and ns.session is not None:
        return "--continue opens the session saved last; it cannot be used with --session"
    if ns.continue_last and ns.batch is not None:
        return '--continue cannot be used with --batch (a batch line names its own "session")'
    return None


def session_to_continue(settings: Settings) -> Path | None:
    """``--continue``: the session saved last, or None (said on stderr: the chat or prompt starts anew,
    as a first ``-c`` on a fresh machine should not be an error)."""
    from radixchat.chat.session import latest_session

    path = latest_session(settings.sessions_dir)
    if path is None:
        error(f"no saved session in {settings.sessions_dir} to continue; starting a new conversation")
    return path


def error(msg: str) -> None:
    print(f"radixchat: {msg}", file=sys.stderr, flush=True)


def run() -> None:
    """The ``radixchat`` command: ``main``, then ``exit_now``."""
    exit_now(main())


def exit_now(code: int) -> typing.NoReturn:
    """Exit with ``code`` without the interpreter's teardown, once nothing is left to finish.

    Unloading the thousands of modules torch and transformers import, one by one, takes about a second, longer
    than a short one-shot reply. By now every file the run wrote is closed (atomic writes), the engine and its
    threads are stopped and the backend closed; the atexit handlers still run (logging's flush, unpausing a
    compile builder) and the standard streams are flushed. Where another thread is still alive, or a stream
    cannot be flushed, the usual exit runs instead, with its usual outcome."""
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if others:
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    try:
        settings = settings_from_args(ns)
    except ConfigError as exc:
        error(str(exc))
        return ExitCode.USAGE
    if problem := flag_conflict(ns):
        error(problem)
        return ExitCode.USAGE
    headless = ns.batch is not None or ns.prompt is not None or ns.list_models or ns.list_tools
    configure_logging(settings, interactive=not headless)
    try:
        check_local_engine_settings(settings)
    except ConfigError as exc:
        error(str(exc))
        return ExitCode.USAGE
    from radixchat.chat.loading import settled_heap

    try:
        if ns.list_models:
            return list_models(settings)
        if ns.list_tools:
            from radixchat.batch.list_tools import list_tools

            return list_tools(settings)
        if ns.batch is not None:
            from radixchat.batch import BatchOptions, run_batch

            options = BatchOptions(
                ns.batch, ns.output, ns.ordered, ns.save_sessions, BatchOptions.tool_names(ns.allow_tools)
            )
            with settled_heap():
                return run_batch(settings, options)
        resume = session_to_continue(settings) if ns.continue_last else None
        if ns.prompt is not None:
            from radixchat.batch import OneShotOptions, run_oneshot

            with settled_heap(grammar=ns.json or ns.schema is not None):
                return run_oneshot(
                    settings,
                    OneShotOptions(
                        ns.prompt, ns.json, ns.schema, tuple(ns.attach or ()), resume, ns.show_thinking
                    ),
                )
        from radixchat.chat.session import load_session
        from radixchat.tui.app import run_app

        session = load_session(resume) if resume is not None else ns.session  # SessionError: exit 2
        with settled_heap():
            return run_app(settings, session=session)
    except ModelLoadError as exc:
        error(str(exc))
        return ExitCode.MODEL
    except KeyboardInterrupt:
        error("interrupted")
        return ExitCode.INTERRUPTED
    except RadixchatError as exc:
        error(str(exc))
        return ExitCode.USAGE


if __name__ == "__main__":
    sys.exit(main())
