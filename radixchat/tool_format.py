"""The ``<tool_call>`` format: how a reply in tool mode writes its calls (Hermes / Qwen style).

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One or more blocks, separated by whitespace. The grammar layer constrains replies to it
(``radixchat.grammar.schema.tool_calls``), the chat layer runs the calls it finds, and the app shows them
as call blocks (``CallFilter`` holds the blocks out of a reply while it streams). All of them read the
format here, and nowhere else: this module needs only the standard library (no torch, no
grammar engine), so the remote path and the app can parse calls without loading either.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, NamedTuple, TypedDict

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"
TOOL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class ToolCall(TypedDict):
    name: str
    arguments: Any


class ToolCallParse(NamedTuple):
    """What a reply said: its plain text part and its tool calls."""

    content: str
    calls: list[ToolCall]


def _call(block: str) -> ToolCall | None:
    """The call a block's JSON makes, or None when it is not one (the block then stays in the text).
    ``arguments`` given as a JSON string (as some models write them) are decoded when they parse."""
    try:
        obj = json.loads(block)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    return {"name": obj["name"], "arguments": args}


def parse_tool_calls(text: str) -> ToolCallParse:
    """Split a reply into its text and its ``<tool_call>`` blocks. Blocks whose JSON does not parse or
    lacks a name stay in the text. A block's JSON is read as JSON first, so a string argument may itself
    contain ``</tool_call>``."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    start = text.find(TOOL_OPEN)
    while start != -1:
        end, call = _block_at(text, start)
        if call is not None:
            calls.append(call)
            kept.append(text[pos:start])
            pos = end
        start = text.find(TOOL_OPEN, max(end, start + 1))
    kept.append(text[pos:])
    return ToolCallParse("".join(kept).strip(), calls)


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _block_at(text: str, start: int) -> tuple[int, ToolCall | None]:
    """(where the block opened at ``start`` ends, its call or None)."""
    body = _SPACE.match(text, start + len(TOOL_OPEN)).end()
    with contextlib.suppress(ValueError):
        _, after = _DECODER.raw_decode(text, body)
        close = _SPACE.match(text, after).end()
        if text.startswith(TOOL_CLOSE, close):
            return close + len(TOOL_CLOSE), _call(text[body:after])
    m = TOOL_BLOCK.match(text, start)  # not JSON up to a closing tag: the old, textual reading
    if m is None:
        return start + len(TOOL_OPEN), None
    return m.end(), _call(m.group(1))


def strip_tool_calls(text: str) -> str:
    """``text`` without its ``<tool_call>`` blocks (what the reply said besides calling)."""
    return parse_tool_calls(text).content


def tool_call_dicts(text: str) -> list[dict[str, Any]]:
    """The calls in ``text`` as plain ``{"name", "arguments"}`` dicts (as messages store them)."""
    return [dict(c) for c in parse_tool_calls(text).calls]


class CallFilter:
    """Streams a reply's text with its ``<tool_call>`` blocks held out.

    ``feed`` returns the text that can be shown now. A tail that may be the start of ``<tool_call>`` is
    held until the next delta tells; inside a block everything is dropped up to ``</tool_call>``.
    """

    def __init__(self) -> None:
        self._held = ""
        self.in_call = False
        self.calls = 0  # blocks begun so far

    def feed(self, delta: str) -> str:
        text, self._held = self._held + delta, ""
        out: list[str] = []
        while text:
            if self.in_call:
                end = text.find(TOOL_CLOSE)
                if end < 0:
                    self._held = _partial_tail(text, TOOL_CLOSE)
                    return "".join(out)
                self.in_call, text = False, text[end + len(TOOL_CLOSE) :]
                continue
            start = text.find(TOOL_OPEN)
            if start >= 0:
                out.append(text[:start])
                self.in_call, self.calls, text = True, self.calls + 1, text[start + len(TOOL_OPEN) :]
                continue
            tail = _partial_tail(text, TOOL_OPEN)
            out.append(text[: len(text) - len(tail)])
            self._held = tail
            break
        return "".join(out)

    def flush(self) -> str:
        """The end of the reply: a held tail that never became a tag is text after all."""
        held, self._held = ("" if self.in_call else self._held), ""
        return held


def _partial_tail(text: str, tag: str) -> str:
    """The longest end of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return text[-n:]
    return ""
