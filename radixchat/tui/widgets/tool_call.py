"""One tool call in the transcript: a collapsible block with the call, its result or error, and timing.

The title says it all on one line (``calculator(expression="2+2") → 4 · 3 ms``); expanding shows the full
arguments and result. A block starts *pending* when the reply that makes the call ends, may be *asking*
(a user tool waits for consent), and ends *ok* or *error*.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from textual.widgets import Collapsible, Markdown

from radixchat.chat.conversation import Message
from radixchat.tui.tools import call_signature, short_json


def took(duration_ms: float | None) -> str:
    if duration_ms is None:
        return ""
    return f"{duration_ms:.1f} ms" if duration_ms < 10 else f"{duration_ms:.0f} ms"


def fenced(text: str) -> str:
    """``text`` as a Markdown code block (JSON pretty-printed and highlighted when it parses)."""
    lang = ""
    with contextlib.suppress(ValueError, TypeError):
        value = json.loads(text)
        if isinstance(value, (dict, list)):
            text, lang = json.dumps(value, indent=2, ensure_ascii=False), "json"
    fence = "````" if "```" in text else "```"
    return f"{fence}{lang}\n{text}\n{fence}"


class ToolCallBlock(Collapsible):
    """``state`` is a CSS class: -pending, -asking, -ok or -error."""

    def __init__(
        self,
        name: str,
        arguments: Any,
        result: str | None = None,
        error: str | None = None,
        duration_ms: float | None = None,
    ) -> None:
        self.call_name, self.arguments = name, arguments
        self.result, self.error, self.duration_ms = result, error, duration_ms
        super().__init__(Markdown(self.details(), classes="call-details"), title="")
        self.set_state("-error" if error is not None else "-ok" if result is not None else "-pending")

    @classmethod
    def from_messages(cls, call: dict[str, Any], result: Message | None) -> ToolCallBlock:
        """A finished call rebuilt from a conversation: the assistant's call and the tool message after it
        (its meta carries ``duration_ms`` and ``error`` when the app ran it)."""
        name, arguments = call.get("name", "?"), call.get("arguments", {})
        if result is None:
            return cls(name, arguments, error="no result (the turn ended before the call ran)")
        content = result.content
        failed = result.meta.get("error")
        if failed is None:
            failed = content.startswith("error: ")
        return cls(
            name,
            arguments,
            None if failed else content,
            content.removeprefix("error: ") if failed else None,
            result.meta.get("duration_ms"),
        )

    def heading(self) -> str:
        sig = call_signature(self.call_name, self.arguments)
        timing = f" · {took(self.duration_ms)}" if self.duration_ms is not None else ""
        if self.error is not None:
            return f"✗ {sig} → error: {short_json(self.error, 40)}{timing}"
        if self.result is not None:
            return f"✓ {sig} → {short_json(self.result, 40)}{timing}"
        if self.has_class("-asking"):
            return f"? {sig} · waiting for your answer"
        return f"… {sig} · running"

    def details(self) -> str:
        parts = ["*arguments*", "", fenced(json.dumps(self.arguments, ensure_ascii=False)), ""]
        timing = f" ({took(self.duration_ms)})" if self.duration_ms is not None else ""
        if self.error is not None:
            parts += [f"*error*{timing}", "", fenced(self.error)]
        elif self.result is not None:
            parts += [f"*result*{timing}", "", fenced(self.result) if self.result else "*(empty)*"]
        return "\n".join(parts)

    def set_asking(self) -> None:
        self.set_state("-asking")

    def set_outcome(self, result: str | None, error: str | None, duration_ms: float | None) -> None:
        self.result, self.error, self.duration_ms = result, error, duration_ms
        self.set_state("-error" if error is not None else "-ok")
        self.query_one(Markdown).update(self.details())

    def set_state(self, state: str) -> None:
        for name in ("-pending", "-asking", "-ok", "-error"):
            self.set_class(name == state, name)
        self.title = self.heading()
