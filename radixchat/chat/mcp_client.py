"""MCP servers as tools: the ``[[mcp_servers]]`` of the config file, through the official ``mcp`` SDK.

A stdio server (``command``) is started by radixchat and stopped when it exits; a streamable-HTTP server
(``url``) is connected to. Each server's tools join the tool registry as ``SERVER_TOOL`` (server names
have no ``_``, so the name says where a tool comes from and never clashes with another server's), need
consent like ``[[tools]]`` commands, and their ``inputSchema`` is the argument grammar.

One long-lived task per server owns its connection: it enters the SDK's transport and session (anyio
context managers, which must be left in the task that entered them), lists the tools, and waits until
``aclose``. Calls are sent from the caller's task over the open session. A server that fails to start,
does not answer within ``timeout_s`` or stops later is a notice: its tools leave the registry and the
chat goes on. The SDK is imported only here, inside the functions, when a server is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from radixchat.chat.tools import Tool, ToolContext, ToolError, ToolRegistry
from radixchat.config import McpServerConfig

RESULT_LIMIT = 64 * 1024  # characters of a result the model sees; the rest is cut, and said
CLOSE_WAIT_S = 8.0  # the SDK stops a stdio server in at most ~6 s (stdin closed, SIGTERM, SIGKILL)

Notice = Callable[[str], None]


class McpServer:
    """One configured server: ``start`` lists its tools (or says why not), ``call`` runs one."""

    def __init__(self, cfg: McpServerConfig, log_dir: Path | None, on_lost: Callable[[McpServer, str], None]):
        self.cfg = cfg
        self.log_dir = log_dir
        self.on_lost = on_lost
        self.session: Any = None  # the SDK's ClientSession while connected
        self.problem: str | None = None  # why it is not serving (start failed, stopped)
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._errlog: TextIO | None = None

    @property
    def source(self) -> str:
        return f"mcp:{self.cfg.name}"

    def where(self) -> str:
        return self.cfg.url or " ".join(self.cfg.command or ())

    async def start(self) -> list[Tool]:
        """Connect and list the tools. Raises ToolError with one line saying why it could not."""
        listed: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(listed), name=f"mcp:{self.cfg.name}")
        try:
            listing = await listed
        except asyncio.CancelledError:  # the front end is closing while the server starts
            await self.aclose()
            raise
        except BaseException as exc:  # noqa: BLE001  # anyio wraps failures in exception groups
            self.problem = self._describe(exc)
            await self.aclose()
            raise ToolError(self.problem) from None
        return [self._tool(t) for t in listing]

    async def _own(self, listed: asyncio.Future[list[Any]]) -> None:
        import anyio
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                with anyio.fail_after(self.cfg.timeout_s):
                    await session.initialize()
                    tools, cursor = [], None
                    while True:  # a server may list its tools a page at a time
                        page = await session.list_tools(params=_page(cursor))
                        tools += page.tools
                        cursor = page.next_cursor
                        if cursor is None:
                            break
                self.session = session
                listed.set_result(tools)
                await self._closing.wait()
        except asyncio.CancelledError:  # aclose while starting
            listed.cancel()
        except BaseException as exc:  # noqa: BLE001  # a failure to start goes to start(); later ones are over
            if not listed.done():
                listed.set_exception(exc)
        finally:
            self.session = None

    def _transport(self) -> contextlib.AbstractAsyncContextManager[Any]:
        if self.cfg.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(self.cfg.url)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        argv = list(self.cfg.command or ())
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=self.cfg.env or None)
        return stdio_client(params, errlog=self._open_errlog())

    def _open_errlog(self) -> TextIO:
        """The server's stderr goes to ``<cache_dir>/mcp-NAME.log`` (never onto the app's screen)."""
        path = Path("/dev/null")
        if self.log_dir is not None:
            with contextlib.suppress(OSError):
                self.log_dir.mkdir(parents=True, exist_ok=True)
                path = self.log_dir / f"mcp-{self.cfg.name}.log"
        try:
            self._errlog = open(path, "w", encoding="utf-8")  # noqa: SIM115  # closed by aclose
        except OSError:
            self._errlog = open("/dev/null", "w")  # noqa: SIM115
        return self._errlog

    def _describe(self, exc: BaseException) -> str:
        """One line for why the server could not start."""
        exc = _leaf(exc)
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.cfg.timeout_s:g} s"
        if isinstance(exc, FileNotFoundError) and self.cfg.command:
            return f"cannot start {self.cfg.command[0]!r}: command not found"
        if isinstance(exc, OSError) and self.cfg.command:
            return f"cannot start {self.cfg.command[0]!r}: {exc.strerror or exc}"
        text = _message(exc)
        if self.cfg.command and "closed" in text.lower():
            tail = self._stderr_tail()
            return "exited before it answered" + (f": {tail}" if tail else "")
        if self.cfg.url is not None:
            return f"cannot use {self.cfg.url}: {text}"
        return text

    def _stderr_tail(self) -> str:
        if self._errlog is None or self._errlog.name == "/dev/null":
            return ""
        with contextlib.suppress(OSError):
            self._errlog.flush()
            lines = Path(self._errlog.name).read_text(encoding="utf-8", errors="replace").strip().splitlines()
            return lines[-1].strip()[:200] if lines else ""
        return ""

    def _tool(self, listed: Any) -> Tool:
        name = listed.name

        async def run(args: dict[str, Any], ctx: ToolContext) -> str:
            return await self.call(name, args)

        schema = listed.input_schema or {"type": "object", "properties": {}}
        description = listed.description or listed.title or ""
        return Tool(f"{self.cfg.name}_{name}", description, schema, run, builtin=False, source=self.source)

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run the server's tool ``name``; its text content joined. Raises ToolError (an error result,
        a timeout, the server gone)."""
        import anyio
        from mcp.shared.exceptions import MCPError
        from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

        session = self.session
        if session is None:
            raise ToolError(f"the MCP server {self.cfg.name!r} is not running")
        try:
            result = await session.call_tool(name, arguments, read_timeout_seconds=self.cfg.timeout_s)
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise ToolError(f"timed out after {self.cfg.timeout_s:g} s") from None
            if exc.code != CONNECTION_CLOSED:
                raise ToolError(exc.error.message) from None
            raise self._lost("connection closed") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError) as exc:
            raise self._lost(_message(_leaf(exc))) from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or "the tool reported an error")
        return text

    def _lost(self, why: str) -> ToolError:
        """The server stopped: say so (its tools leave the registry); the error for the call."""
        self.problem = f"stopped ({why})"
        self.session = None
        self.on_lost(self, self.problem)
        return ToolError(f"the MCP server {self.cfg.name!r} {self.problem}")

    async def aclose(self) -> None:
        """Leave the session and the transport (a stdio server is stopped); bounded, never raises."""
        self._closing.set()
        task, self._task = self._task, None
        if task is not None and self.session is None:
            task.cancel()  # still starting: stop waiting for it (the SDK still stops the process)
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), CLOSE_WAIT_S)
            except (asyncio.TimeoutError, Exception):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None


def result_text(result: Any) -> str:
    """A tool result as the model sees it: the text blocks joined (other kinds named), or the structured
    content as JSON when there is no text; cut at ``RESULT_LIMIT`` characters."""
    parts = [b.text if b.type == "text" else f"[{b.type} content]" for b in result.content]
    text = "\n".join(parts)
    if not parts and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    if len(text) > RESULT_LIMIT:
        text = text[:RESULT_LIMIT] + f"\n… (cut at {RESULT_LIMIT} characters)"
    return text


def _page(cursor: str | None) -> Any:
    if cursor is None:
        return None
    from mcp_types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


def _leaf(exc: BaseException) -> BaseException:
    """The first exception inside (anyio task groups wrap them in groups)."""
    while isinstance(inner := getattr(exc, "exceptions", None), (list, tuple)) and inner:
        exc = inner[0]
    return exc


def _message(exc: BaseException) -> str:
    error = getattr(exc, "error", None)  # the SDK's MCPError carries its ErrorData
    text = getattr(error, "message", None) or str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


class McpTools:
    """The configured servers of one front end: ``start`` connects to all at once and adds each one's
    tools to ``registry`` as it lists them; failures and servers that stop later are notices."""

    def __init__(self, servers: list[McpServerConfig], registry: ToolRegistry, log_dir: Path | None) -> None:
        self.registry = registry
        self.notice: Notice = lambda text: None
        self.servers = [McpServer(cfg, log_dir, self._lost) for cfg in servers]
        self.starting = {s.cfg.name for s in self.servers}
        self.failed: dict[str, str] = {}  # server name → why it is not serving

    async def start(self, notice: Notice) -> None:
        """Start every server; returns when each has listed its tools or failed (never raises). Problems,
        then and later, go to ``notice`` (one line each)."""
        self.notice = notice
        await asyncio.gather(*(self._start(s) for s in self.servers))

    async def _start(self, server: McpServer) -> None:
        try:
            tools = await server.start()
        except ToolError as exc:
            self.failed[server.cfg.name] = str(exc)
            self.notice(f"MCP server {server.cfg.name!r} ({server.where()}): {exc}; its tools are left out")
            return
        finally:
            self.starting.discard(server.cfg.name)
        for problem in self.registry.add(tools):
            self.notice(f"MCP server {server.cfg.name!r}: {problem} (left out)")

    def _lost(self, server: McpServer, why: str) -> None:
        self.failed[server.cfg.name] = why
        self.registry.remove(server.source)
        self.notice(f"MCP server {server.cfg.name!r} {why}; its tools are no longer offered")

    def pending(self, name: str) -> bool:
        """Whether ``name`` may be a tool of a server that is still starting."""
        return any(name.startswith(f"{s}_") for s in self.starting)

    async def aclose(self) -> None:
        await asyncio.gather(*(s.aclose() for s in self.servers))
