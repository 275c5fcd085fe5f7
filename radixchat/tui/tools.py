"""Tool mode's pieces that need no Textual: the registry, the offered tools, and how calls are shown.

The registry holds the built-in tools, the user tools of the config file (``[[tools]]``) and, once their
servers have listed them, the tools of its MCP servers (``[[mcp_servers]]``, ``chat/mcp_client.py``); a session
offers a subset (``SessionFile.tools``; empty means the built-ins, as in batch mode). A reply in tool mode
writes its calls as ``<tool_call>{...}</tool_call>`` blocks, read only by ``radixchat.tool_format``: the
transcript shows them as call blocks, so its ``CallFilter`` keeps them out of the streamed Markdown.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from radixchat.chat.session_state import ToolChoice
from radixchat.chat.tools import Tool, ToolRegistry
from radixchat.errors import RadixchatError

if TYPE_CHECKING:
    from radixchat.config import Settings

CHOICES = ("auto", "required", "none")


def build_registry(settings: Settings) -> tuple[ToolRegistry, str | None]:
    """The built-ins plus the config file's user tools; on a bad declaration, the built-ins and why."""
    try:
        reg = ToolRegistry.from_config(settings.tools)
        return reg, ("; ".join(reg.problems) + " (left out)" if reg.problems else None)
    except RadixchatError as exc:
        return ToolRegistry(), f"{exc}; only the built-in tools are offered"


def offered(registry: ToolRegistry, names: list[str] | None) -> list[Tool]:
    """The tools a session offers (None: the built-ins); names the registry lacks are skipped."""
    if names is None:
        return registry.select(None)
    return [registry.tools[n] for n in dict.fromkeys(names) if n in registry.tools]


def unknown_tools_problem(known: Callable[[str], bool], preset: str, names: list[str] | None) -> str | None:
    """Why some tools a preset names are not offered (no tool has the name), or None."""
    unknown = [n for n in names or () if not known(n)]
    if not unknown:
        return None
    return f"preset '{preset}': no tool named {', '.join(repr(n) for n in unknown)} (left out)"


def choice_label(choice: ToolChoice) -> str:
    return choice["name"] if isinstance(choice, dict) else choice


def command_of(settings: Settings, name: str) -> list[str] | None:
    """The command a user tool runs, or the command or URL of the MCP server it comes from (to show in
    the consent dialog)."""
    for cfg in settings.tools:
        if cfg.name == name:
            return list(cfg.command)  # type: ignore[arg-type]  # the validator split it
    for server in settings.mcp_servers:
        if name.startswith(f"{server.name}_"):
            return list(server.command) if server.command else [server.url or ""]
    return None


def short_json(value: Any, limit: int = 60) -> str:
    """One line of JSON, cut with an ellipsis (call titles)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def call_signature(name: str, arguments: Any, limit: int = 48) -> str:
    """``calculator(expression="2+2")``: the arguments as ``key=value`` with JSON values, shortened."""
    if isinstance(arguments, dict):
        inner = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
    else:
        inner = json.dumps(arguments, ensure_ascii=False)
    return f"{name}({short_json(inner, limit)})"
