"""Tool calls in the Hermes / Qwen style, constrained to the declared tools.

Output format (what the model writes, and what ``parse_tool_calls`` reads back)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One or more blocks, separated by whitespace. ``name`` comes first and must be a declared tool;
``arguments`` must satisfy that tool's ``parameters`` JSON Schema (same rules as
``compile_json_schema``; a tool without ``parameters`` takes ``{}``).

``tool_choice``:
- ``"auto"``: free text, tool calls, or text then calls. Free text never contains ``<tool_call>`` and
  does not start with whitespace; text before calls is one terminal ending with the opening tag.
- ``"required"``: one or more tool calls, nothing else.
- ``"none"``: free text only (it may not start with ``<tool_call>``).
- ``{"name": "x"}`` or ``{"type": "function", "function": {"name": "x"}}``: exactly one call of x.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from radixchat.tool_format import TOOL_CLOSE, TOOL_OPEN, ToolCall, ToolCallParse, parse_tool_calls

from .. import regex as rx
from ..compiler import CompiledGrammar
from ..errors import GrammarError
from ..matcher import GrammarMatcher
from . import json_terminals as jt
from .json_schema import SchemaCompiler
from .lark_text import LarkWriter

# The format itself (and its parser) lives in radixchat.tool_format; re-exported for grammar's users.
__all__ = ["ToolCall", "ToolCallParse", "compile_tool_call_grammar", "parse_tool_calls", "tool_call_lark"]


def _text_terminal(lead: bool = False) -> str:
    """Free text that does not start with whitespace and never contains ``<tool_call>``; with ``lead``,
    such text followed by ``<tool_call>``, which ends it (so the greedy lexer stops exactly there).

    ``<`` occurs in the tag only first, so text avoids the tag iff every ``<`` in it is followed by
    something other than the rest of the tag: text = (first part)(``<`` Y)*, where Y has no ``<`` and
    does not start with ``tool_call>``."""
    rest = TOOL_OPEN[1:]
    lt = ((ord("<"), ord("<")),)
    no_lt = ("set", rx.negate(lt))
    # The alternatives that go on come before the bare prefixes (which only end a text): the language is
    # the same, but a backtracking regex engine (Python's, in Lark's lexer) takes the first alternative
    # that lets the whole pattern match, and would otherwise end the text at a lone "<".
    diverging, prefixes = [], []
    for i in range(len(rest)):
        diverge = ("set", rx.negate(rx.norm([*lt, (ord(rest[i]), ord(rest[i]))])))
        diverging.append(rx.cat(rx.lit(rest[:i]), diverge, rx.rep(no_lt, 0, None)))
        prefixes.append(rx.lit(rest[:i]))
    y = rx.alt(*diverging, *prefixes)
    first = ("set", rx.negate(rx.norm(list(rx.unicode_category("space")) + list(lt))))
    head = rx.alt(rx.cat(first, rx.rep(no_lt, 0, None)), rx.cat(rx.lit("<"), y))
    text = rx.cat(head, rx.rep(rx.cat(rx.lit("<"), y), 0, None))
    return rx.to_regex(rx.cat(text, rx.lit(TOOL_OPEN)) if lead else text)


def _tool_name(tool: dict) -> str:
    fn = tool.get("function", tool) if tool.get("type") == "function" else tool
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise GrammarError(f"tool without a name: {json.dumps(tool)[:80]}")
    return name


def _tool_params(tool: dict):
    fn = tool.get("function", tool) if tool.get("type") == "function" else tool
    params = fn.get("parameters")
    return {"type": "object", "properties": {}} if params is None else params


def _chosen(tool_choice) -> str | None:
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function", tool_choice)
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise GrammarError(f"tool_choice {tool_choice!r} names no tool")
        return name
    return None


def tool_call_lark(
    tools: list[dict], tool_choice="auto", *, lenient: bool = False, max_calls: int = 1
) -> str:
    """Lark grammar text for replies under ``tool_choice`` with the declared ``tools``."""
    if tool_choice not in ("auto", "required", "none") and not isinstance(tool_choice, dict):
        raise GrammarError(f"tool_choice must be auto, required, none or a tool name, not {tool_choice!r}")
    w = LarkWriter()
    names = [_tool_name(t) for t in tools]
    if len(set(names)) != len(names):
        raise GrammarError("tool names must be unique")
    chosen = _chosen(tool_choice)
    if chosen is not None and chosen not in names:
        raise GrammarError(f"tool_choice names an undeclared tool {chosen!r}")
    calls = []
    if tool_choice != "none":
        key_name = w.terminal(rx.to_regex(jt.exact_string("name")), "K")
        key_args = w.terminal(rx.to_regex(jt.exact_string("arguments")), "K")
        for _i, (tool, name) in enumerate(zip(tools, names)):
            if chosen is not None and name != chosen:
                continue
            comp = SchemaCompiler(_tool_params(tool), lenient)
            comp.w = w
            try:
                args = comp.symbol(comp.root, "")
            except GrammarError as exc:
                raise GrammarError(f"tool {name!r}: {exc}") from None
            if args is None:
                raise GrammarError(f"tool {name!r}: its parameters accept no value")
            rule = w.new_rule("call", f"(tool {name!r} parameters)")
            name_t = w.terminal(rx.to_regex(jt.exact_string(name)), "N")
            w.rule(rule, [['"{"', key_name, '":"', name_t, '","', key_args, '":"', args, '"}"']])
            calls.append(rule)
        if not calls:
            raise GrammarError("tool_choice requires a call but no tools are declared")
    if max_calls < 1:
        raise GrammarError(f"max_calls must be at least 1, not {max_calls}")
    most = 1 if chosen is not None else max_calls
    alts: list[list[str]] = []
    if tool_choice in ("auto", "none"):
        # Free text is unbounded: a first-match lexer (Lark's) would try it before the tag and read a
        # lone "<" as text. The lowest priority makes every lexer try the tag first, as ours (longest
        # match) reads it anyway.
        alts.append([w.terminal(_text_terminal(), "TEXT", priority=-1)])
    if calls:
        w.rule("tool_call", [[c] for c in calls])
        w.rule("tool_block", [[f'"{TOOL_OPEN}"', "tool_call", f'"{TOOL_CLOSE}"']])
        # tool_calls_k: one to k blocks (right-recursive, so a complete block may end the reply).
        for k in range(1, most + 1):
            more = [["tool_block", f"tool_calls_{k - 1}"]] if k > 1 else []
            w.rule(f"tool_calls_{k}", [["tool_block"], *more])
        alts.append([f"tool_calls_{most}"])
        if tool_choice == "auto":
            # Text, then calls: the text's terminal ends with the opening tag (it cannot contain it
            # before), so the greedy lexer ends it exactly there.
            lead = w.terminal(_text_terminal(lead=True), "LEAD", priority=-1)
            alts.append([lead, "tool_call", f'"{TOOL_CLOSE}"'])
            if most > 1:
                alts.append([lead, "tool_call", f'"{TOOL_CLOSE}"', f"tool_calls_{most - 1}"])
    w.rule("reply", alts)
    return w.text("reply", header="// generated by radixchat.grammar.tool_calls")


def compile_tool_call_grammar(
    tools: list[dict], info, tool_choice="auto", *, lenient: bool = False, max_calls: int = 1
):
    """Compile the tool-call grammar for the declared ``tools`` (OpenAI-style dicts or plain
    ``{"name", "description", "parameters"}``). See the module docstring for ``tool_choice``."""
    text = tool_call_lark(tools, tool_choice, lenient=lenient, max_calls=max_calls)
    return ToolCallGrammar(text, info, source="<tool calls>", glr=True)


class ToolCallGrammar(CompiledGrammar):
    """A tool-call grammar whose matchers close the reply between blocks when the budget left is
    shorter than the longest block so far (see ``ToolCallMatcher``)."""

    def matcher(self) -> ToolCallMatcher:
        return ToolCallMatcher(self)


_OPEN, _CLOSE = TOOL_OPEN.encode(), TOOL_CLOSE.encode()


class ToolCallMatcher(GrammarMatcher):
    """A grammar matcher that knows where call blocks begin and end.

    Budget steering alone keeps every block it lets the model open finishable, but only by its
    *shortest* completion: a model that opens another block with too little budget left for the call it
    means to write is squeezed into a minimal one (``{"name": "now", "arguments": {}}``) that then runs.
    So between blocks, a new one may open only while the budget left covers the longest block written
    so far, measured as the steering measures completions (in bytes, a bound on tokens); otherwise only
    EOS is allowed and the reply ends with its complete calls.
    """

    __slots__ = ("_tail", "_taken", "_opened_at", "_longest")

    def __init__(self, grammar: CompiledGrammar) -> None:
        super().__init__(grammar)
        self._tail = b""  # the last bytes taken (a tag may span tokens)
        self._taken = 0  # bytes taken so far
        self._opened_at: int | None = None  # where the current block's opening tag began (bytes taken)
        self._longest = 0  # bytes of the longest complete block, its tags included

    def allowed(self, remaining: int | None = None) -> torch.Tensor:
        mask = super().allowed(remaining)
        if (
            remaining is None
            or self._longest == 0
            or self._opened_at is not None
            or self.finished
            or remaining - 2 >= self._longest  # as budget_mask: EOS and one token of slack
            or not self.is_accepting()
        ):
            return mask
        only_eos = np.zeros(self.grammar.info.vocab_size, dtype=bool)
        only_eos[list(self._eos)] = True
        tensor, _ = self.grammar.runs.intern_mask(only_eos)
        self.budget_limited = tensor is not mask
        return tensor

    def advance(self, token_id: int) -> None:
        super().advance(token_id)
        data = None if self.finished else self.grammar.token_bytes(int(token_id))
        if not data:
            return
        seen = self._tail + data
        base = self._taken - len(self._tail)  # bytes taken before seen[0]
        pos = 0
        while True:
            tag = _CLOSE if self._opened_at is not None else _OPEN
            at = seen.find(tag, pos)
            if at < 0 or at + len(tag) <= len(self._tail):  # tags that ended earlier were seen then
                break
            if self._opened_at is None:
                self._opened_at = base + at
            else:
                self._longest = max(self._longest, base + at + len(tag) - self._opened_at)
                self._opened_at = None
            pos = at + len(tag)
        self._taken += len(data)
        self._tail = seen[-(len(_CLOSE) - 1) :]

    def copy(self) -> ToolCallMatcher:
        m = ToolCallMatcher.__new__(ToolCallMatcher)
        for name in (*GrammarMatcher.__slots__, *ToolCallMatcher.__slots__):
            setattr(m, name, getattr(self, name))
        return m
