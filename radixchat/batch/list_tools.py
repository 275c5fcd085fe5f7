"""``radixchat --list-tools``: every tool tool mode can offer (built-ins, the config file's ``[[tools]]``,
its MCP servers' tools), one line each: name, where it comes from, description. The MCP servers are
started, listed and stopped; the model is not loaded. A server that fails, or a ``[[tools]]`` entry left
out, is a line on stderr and exit code 1; all well, 0.
"""

from __future__ import annotations

import asyncio
import sys

from radixchat.chat.mcp_client import McpTools, Notice
from radixchat.chat.tools import ToolRegistry
from radixchat.config import Settings
from radixchat.exit_codes import ExitCode

DESCRIPTION = 70  # characters of a description shown


def list_tools(settings: Settings) -> int:
    """Print the table on stdout; RadixchatError (a [[tools]] name that clashes with a built-in) → exit 2."""
    registry = ToolRegistry.from_config(settings.tools)
    problems = [f"{p} (left out)" for p in registry.problems]
    asyncio.run(_add_mcp_tools(settings, registry, problems.append))
    rows = [("NAME", "SOURCE", "DESCRIPTION")]
    rows += [(t.name, t.source, _short(t.description)) for t in registry.tools.values()]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for name, source, description in rows:
        print(f"{name:<{widths[0]}}  {source:<{widths[1]}}  {description}".rstrip())
    for problem in problems:
        print(f"radixchat: {problem}", file=sys.stderr)
    return ExitCode.FAILED if problems else ExitCode.OK


async def _add_mcp_tools(settings: Settings, registry: ToolRegistry, notice: Notice) -> None:
    mcp = McpTools(settings.mcp_servers, registry, settings.cache_dir)
    try:
        await mcp.start(notice)
    finally:
        await mcp.aclose()


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= DESCRIPTION else line[: DESCRIPTION - 1] + "…"
