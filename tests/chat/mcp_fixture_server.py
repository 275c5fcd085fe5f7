"""A small MCP server (the SDK's MCPServer, once FastMCP) that the MCP tests start for real: over stdio
(``python mcp_fixture_server.py``) or streamable HTTP (``python mcp_fixture_server.py http PORT``).
``hang PIDFILE`` makes a server that writes its process id and never answers (a start that times out)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("fixture", log_level="ERROR")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
async def slow(seconds: float) -> str:
    """Wait, then say done."""
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@server.tool()
def pid() -> int:
    """The server's process id (so a test can kill it)."""
    return os.getpid()


if __name__ == "__main__":
    if sys.argv[1:2] == ["hang"]:
        with open(sys.argv[2], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)
    elif sys.argv[1:2] == ["http"]:
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run()
