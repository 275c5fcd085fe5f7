"""The tools tool mode offers: their declarations (name, description, JSON Schema parameters).

Only the built-in tools: user tools from the config file run commands and need the user's consent per
call, and the app has no consent dialog yet (see docs/tui.md).
"""

from __future__ import annotations

from typing import Any


def available_tools() -> list[dict[str, Any]]:
    try:
        from radixchat.chat.tools import ToolRegistry
    except ImportError:  # a build without the tools module
        return []
    return [tool.schema() for tool in ToolRegistry().select(None)]
