"""Tools the model may call in tool mode: built-ins that are safe by construction, and user tools
declared in the config file that run a command (only with consent).

A user tool's command receives the arguments as JSON on stdin and prints its result on stdout (plain
text, or JSON when ``output = "json"``). A timeout, a non-zero exit, output over the size limit, or
(for ``output = "json"``) output that is not JSON comes back to the model as an error result.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import math
import operator
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from radixchat.config import UserToolConfig
from radixchat.errors import RadixchatError

NOTES_LIMIT = 64 * 1024
NOTE_TEXT = 200  # most characters one call writes (each counted character is a grammar state)


class ToolError(RadixchatError):
    """A tool call failed; the message goes back to the model as the call's result."""


@dataclass
class ToolContext:
    """What built-in tools may touch: the session's scratch notes."""

    notes: str = ""


Runner = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Runner
    builtin: bool = True  # built-ins are safe by construction and need no consent
    source: str = "built-in"  # or "config" ([[tools]]) or "mcp:SERVER" ([[mcp_servers]])

    def schema(self) -> dict[str, Any]:
        """The declaration the grammar takes (everything it enforces)."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def declaration(self) -> dict[str, Any]:
        """The declaration the chat template shows the model: the schema without what only the grammar
        needs (an ``x-grammar``'s text, an enum of hundreds of time zones), which would cost prompt
        tokens and say little to a model."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": _for_prompt(self.parameters),
        }


PROMPT_ENUM = 12  # longer enums are shown as a few examples


def _for_prompt(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_for_prompt(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _for_prompt(v) for k, v in schema.items() if k not in ("x-grammar", "x-grammar-start")}
    if "x-grammar" in schema:
        out.setdefault("type", "string")
    values = schema.get("enum")
    if isinstance(values, list) and len(values) > PROMPT_ENUM:
        del out["enum"]
        out.setdefault("type", "string")
        examples = ", ".join(str(v) for v in values[:: max(1, len(values) // 3)][:3])
        out["description"] = (
            schema.get("description", "") + f" One of {len(values)} values, e.g. {examples}."
        ).strip()
    return out


# -- the calculator: arithmetic on numbers by walking the AST (never eval) ------------------------------

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION = 900  # above the longest expression CALCULATOR_GRAMMAR allows (892 characters)
MAX_NODES = 200
MAX_INT_BITS = 4096
MAX_EXPONENT = 10_000


def calculate(expression: str) -> int | float:
    """Evaluate ``+ - * / // % **`` and parentheses over int and float literals. Raises ToolError."""
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError("expression too complex")
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"only numbers are allowed, not {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            value = _BINOPS[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
        if isinstance(value, complex):
            raise ToolError("result is not a real number")
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise ToolError("result too large")
        if isinstance(value, float) and not math.isfinite(value):
            raise ToolError("result too large")
        return value
    kind = type(node).__name__
    what = {"Name": "a name", "Call": "a function call", "Attribute": "attribute access"}.get(kind, kind)
    raise ToolError(f"only arithmetic on numbers is allowed (found {what})")


def _check_power(base: int | float, exp: int | float) -> None:
    if abs(exp) > MAX_EXPONENT:
        raise ToolError(f"exponent {exp} is too large (limit {MAX_EXPONENT})")
    # A lower bound on the result's size, so 9**9**9-style inputs are refused before any work.
    if (
        isinstance(base, int)
        and isinstance(exp, int)
        and exp > 0
        and (abs(base).bit_length() - 1) * exp > MAX_INT_BITS
    ):
        raise ToolError("result too large")


def _level(name: str, term: str, inner: str | None, most: int) -> list[str]:
    alts = " | ".join(" OP ".join([term] * k) for k in range(1, most + 1))
    atom = f'NUM | "(" {inner} ")"' if inner else "NUM"
    return [f"{name}: {alts}", f"{term}: {atom}"]


#: The language ``calculate`` evaluates, as the ``x-grammar`` of the calculator's argument: numbers
#: (an optional minus, up to 12 digits and 6 decimals), ``+ - * / // % **`` with at most one space on
#: each side, parentheses nested up to two deep, at most 4 terms at the top and 3 inside parentheses.
#: Bounded by construction: at most 4 * 220 + 3 * 4 = 892 characters.
CALCULATOR_GRAMMAR = "\n".join(
    [
        "start: e3",
        *_level("e3", "t3", "e2", 4),
        *_level("e2", "t2", "e1", 3),
        *_level("e1", "t1", None, 3),
        r"NUM: /-?[0-9]{1,12}(\.[0-9]{1,6})?/",
        r"OP: / ?(\*\*|\/\/|[-+*\/%]) ?/",
    ]
)


async def _calculator(args: dict[str, Any], ctx: ToolContext) -> str:
    value = calculate(str(args["expression"]))
    return repr(value) if isinstance(value, float) else str(value)


async def _now(args: dict[str, Any], ctx: ToolContext) -> str:
    name = args.get("timezone") or "UTC"
    try:
        tz = timezone.utc if name.upper() == "UTC" else ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {name!r} (use an IANA name such as Europe/Paris)") from None
    now = datetime.now(tz)
    return f"{now.isoformat(timespec='seconds')} ({now.strftime('%A')}, {name})"


async def _read_notes(args: dict[str, Any], ctx: ToolContext) -> str:
    return ctx.notes or "(the notes are empty)"


async def _write_notes(args: dict[str, Any], ctx: ToolContext) -> str:
    text = str(args["text"])
    new = ctx.notes + text if args.get("mode") == "append" else text
    if len(new) > NOTES_LIMIT:
        raise ToolError(f"notes would exceed {NOTES_LIMIT} characters")
    ctx.notes = new
    return f"saved ({len(new)} characters)"


def builtin_tools() -> dict[str, Tool]:
    obj = lambda props, req: {"type": "object", "properties": props, "required": req}  # noqa: E731
    tools = [
        Tool(
            "calculator",
            "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
            obj({"expression": {"type": "string", "x-grammar": CALCULATOR_GRAMMAR}}, ["expression"]),
            _calculator,
        ),
        Tool(
            "now",
            "The current date and time, optionally in an IANA time zone such as Europe/Paris.",
            obj(
                {"timezone": {"enum": sorted(available_timezones()), "description": "an IANA time zone"}}, []
            ),
            _now,
        ),
        Tool(
            "read_session_notes", "Read the scratch notes saved with this session.", obj({}, []), _read_notes
        ),
        Tool(
            "write_session_notes",
            "Replace (or append to) the scratch notes saved with this session.",
            obj(
                {
                    "text": {"type": "string", "minLength": 1, "maxLength": NOTE_TEXT},
                    "mode": {"enum": ["replace", "append"]},
                },
                ["text"],
            ),
            _write_notes,
        ),
    ]
    return {t.name: t for t in tools}


# -- user tools: a command, JSON arguments on stdin ------------------------------------------------------


def user_tool(cfg: UserToolConfig) -> Tool:
    async def run(args: dict[str, Any], ctx: ToolContext) -> str:
        return await run_command(cfg, args)

    return Tool(cfg.name, cfg.description, cfg.parameters, run, builtin=False, source="config")


async def run_command(cfg: UserToolConfig, args: dict[str, Any]) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *cfg.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise ToolError(f"cannot start {cfg.command[0]!r}: {exc.strerror or exc}") from None
    try:
        out, err = await asyncio.wait_for(
            _communicate(proc, json.dumps(args).encode(), cfg.max_output_bytes), timeout=cfg.timeout_s
        )
    except asyncio.TimeoutError:
        _kill(proc)
        await proc.wait()
        raise ToolError(f"timed out after {cfg.timeout_s:g} s") from None
    except _TooMuchOutput:
        _kill(proc)
        await proc.wait()
        raise ToolError(f"output exceeded {cfg.max_output_bytes} bytes") from None
    except asyncio.CancelledError:  # the turn was stopped or the app is quitting: never leave it running
        _kill(proc)
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise ToolError(f"exited with status {proc.returncode}" + (f": {tail[0][:200]}" if tail[0] else ""))
    text = out.decode("utf-8", "replace").strip()
    if cfg.output == "json":
        try:
            return json.dumps(json.loads(text), ensure_ascii=False)
        except ValueError:
            raise ToolError("printed output that is not valid JSON") from None
    return text


class _TooMuchOutput(Exception):
    pass


async def _communicate(proc: asyncio.subprocess.Process, data: bytes, limit: int) -> tuple[bytes, bytes]:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
        proc.stdin.close()
    chunks: list[bytes] = []
    size = 0
    err_task = asyncio.ensure_future(proc.stderr.read(64 * 1024))
    while True:
        chunk = await proc.stdout.read(65536)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            err_task.cancel()
            raise _TooMuchOutput
        chunks.append(chunk)
    await proc.wait()
    return b"".join(chunks), await err_task


def _kill(proc: asyncio.subprocess.Process) -> None:
    import os
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def string_grammar_problem(schema: Any, path: str = "#") -> str | None:
    """The first ``x-grammar`` in ``schema`` that Lark cannot build as an LALR(1) parser (torch-free: the
    engine's compiler checks the rest when the tool is first offered), or None."""
    if isinstance(schema, list):
        for i, sub in enumerate(schema):
            got = string_grammar_problem(sub, f"{path}/{i}")
            if got:
                return got
        return None
    if not isinstance(schema, dict):
        return None
    text = schema.get("x-grammar")
    if text is not None:
        import lark

        try:
            lark.Lark(text, parser="lalr", start=schema.get("x-grammar-start", "start"))
        except Exception as exc:  # Lark raises several kinds (GrammarError, ConfigurationError, ...)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return f"x-grammar at {path}: {first}"
    for key, sub in schema.items():
        if isinstance(sub, (dict, list)):
            got = string_grammar_problem(sub, f"{path}/{key}")
            if got:
                return got
    return None


# -- the registry ------------------------------------------------------------------------------------


@dataclass
class ToolCallRecord:
    name: str
    arguments: Any
    result: str | None = None
    error: str | None = None
    duration_ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments, "result": self.result, "error": self.error}

    def message_content(self) -> str:
        """What the model sees as the tool message."""
        return self.result if self.error is None else f"error: {self.error}"


Consent = Callable[[Tool, dict[str, Any]], Awaitable[bool]]


@dataclass
class ToolRegistry:
    tools: dict[str, Tool] = field(default_factory=builtin_tools)

    #: User tools left out at start-up, one line each ("tool 'x': x-grammar at #/properties/e: ...").
    problems: list[str] = field(default_factory=list)

    @classmethod
    def from_config(cls, user_tools: list[UserToolConfig]) -> ToolRegistry:
        reg = cls()
        for cfg in user_tools:
            if cfg.name in reg.tools:
                raise RadixchatError(f"tool '{cfg.name}' in the config file clashes with a built-in tool")
            problem = string_grammar_problem(cfg.parameters)
            if problem is not None:  # the other tools still load
                reg.problems.append(f"tool {cfg.name!r}: {problem}")
                continue
            reg.tools[cfg.name] = user_tool(cfg)
        return reg

    def add(self, tools: list[Tool]) -> list[str]:
        """Add tools that arrive after start-up (an MCP server's); one whose name is taken is left out,
        and the returned lines say so."""
        problems = []
        for tool in tools:
            if tool.name in self.tools:
                problems.append(f"tool {tool.name!r} clashes with a {self.tools[tool.name].source} tool")
            else:
                self.tools[tool.name] = tool
        return problems

    def remove(self, source: str) -> None:
        """Take out every tool of ``source`` (an MCP server that stopped)."""
        self.tools = {n: t for n, t in self.tools.items() if t.source != source}

    def select(self, names: list[str] | None) -> list[Tool]:
        """The tools named (all built-ins when ``names`` is None). Raises RadixchatError for unknown names."""
        if names is None:
            return [t for t in self.tools.values() if t.builtin]
        unknown = [n for n in names if n not in self.tools]
        if unknown:
            raise RadixchatError(f"unknown tool {unknown[0]!r} (known: {', '.join(self.tools)})")
        return [self.tools[n] for n in dict.fromkeys(names)]

    async def call(self, name: str, arguments: Any, ctx: ToolContext, consent: Consent) -> ToolCallRecord:
        """Validate, ask for consent (user tools), run. Failures become the record's error, never raise."""
        import jsonschema

        record = ToolCallRecord(name, arguments)
        started = time.perf_counter()
        tool = self.tools.get(name)
        try:
            if tool is None:
                raise ToolError(f"unknown tool {name!r}")
            if not isinstance(arguments, dict):
                raise ToolError("arguments must be a JSON object")
            try:  # the grammar makes a violation impossible; check anyway before running anything
                jsonschema.validate(arguments, tool.parameters)
            except jsonschema.ValidationError as exc:
                raise ToolError(_invalid(exc)) from None
            if not tool.builtin and not await consent(tool, arguments):
                raise ToolError("the user did not allow this call")
            record.result = await tool.run(arguments, ctx)
        except ToolError as exc:
            record.error = str(exc)
        except Exception as exc:  # a bug in a tool must not end the conversation
            record.error = f"{type(exc).__name__}: {exc}"
        record.duration_ms = (time.perf_counter() - started) * 1000
        return record


def _invalid(exc: Any) -> str:
    """A short message naming the argument (an enum of 600 time zones is not listed)."""
    where = "/".join(str(p) for p in exc.absolute_path)
    what = f"invalid argument {where!r}" if where else "invalid arguments"
    if exc.validator == "enum":
        return f"{what}: {exc.instance!r} is not one of the allowed values"
    return f"{what}: {exc.message}"


async def deny_all(tool: Tool, arguments: dict[str, Any]) -> bool:
    return False


def allow_listed(names: set[str]) -> Consent:
    """Batch mode's consent: only the tools named with --allow-tools."""

    async def consent(tool: Tool, arguments: dict[str, Any]) -> bool:
        return tool.name in names

    return consent
