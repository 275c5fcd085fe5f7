"""Tool calls in the Hermes / Qwen style, constrained to the declared tools.

Output format (what the model writes, and what ``parse_tool_calls`` reads back)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

One or more blocks, separated by whitespace. ``name`` comes first and must be a declared tool;
``arguments`` must satisfy that tool's ``parameters`` JSON Schema (same rules as
``compile_json_schema``; a tool without ``parameters`` takes ``{}``).

``tool_choice``:
- ``"auto"``: free text *or* tool calls. Free text may be anything that does not start with
  ``<tool_call>`` (nor with whitespace, which is skipped); it runs until EOS. Text followed by a call
  is not part of the grammar (a greedy byte lexer cannot end free text exactly before a tag).
- ``"required"``: one or more tool calls, nothing else.
- ``"none"``: free text only (it may not start with ``<tool_call>``).
- ``{"name": "x"}`` or ``{"type": "function", "function": {"name": "x"}}``: exactly one call of x.
"""

from __future__ import annotations

import json

from radixchat.tool_format import TOOL_CLOSE, TOOL_OPEN, ToolCall, ToolCallParse, parse_tool_calls

from .. import regex as rx
from ..compiler import CompiledGrammar
from ..errors import GrammarError
from . import json_terminals as jt
from .json_schema import SchemaCompiler
from .lark_text import LarkWriter

# The format itself (and its parser) lives in radixchat.tool_format; re-exported for grammar's users.
__all__ = ["ToolCall", "ToolCallParse", "compile_tool_call_grammar", "parse_tool_calls", "tool_call_lark"]


def _text_terminal() -> str:
    """Free text that neither starts with whitespace nor with ``<tool_call>`` (any text after that)."""
    anything = rx.rep(("set", rx.ALL), 0, None)
    first = ("set", rx.negate(rx.norm(list(rx._unicode_category("space")) + [(ord("<"), ord("<"))])))
    alts = [rx.cat(first, anything)]
    for i in range(1, len(TOOL_OPEN)):
        diverge = ("set", rx.negate(((ord(TOOL_OPEN[i]), ord(TOOL_OPEN[i])),)))
        alts.append(rx.cat(rx.lit(TOOL_OPEN[:i]), diverge, anything))
    return rx.to_regex(rx.alt(*alts))


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
    tools: list[dict], tool_choice="auto", *, lenient: bool = False, parallel: bool = True
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
            args = comp.symbol(comp.root, "")
            if args is None:
                raise GrammarError(f"tool {name!r}: its parameters accept no value")
            rule = w.new_rule("call", f"(tool {name!r} parameters)")
            name_t = w.terminal(rx.to_regex(jt.exact_string(name)), "N")
            w.rule(rule, [['"{"', key_name, '":"', name_t, '","', key_args, '":"', args, '"}"']])
            calls.append(rule)
        if not calls:
            raise GrammarError("tool_choice requires a call but no tools are declared")
    alts: list[list[str]] = []
    if tool_choice in ("auto", "none"):
        alts.append([w.terminal(_text_terminal(), "TEXT")])
    if calls:
        w.rule("tool_call", [[c] for c in calls])
        w.rule("tool_block", [[f'"{TOOL_OPEN}"', "tool_call", f'"{TOOL_CLOSE}"']])
        if parallel and chosen is None:
            w.rule("tool_calls", [["tool_block"], ["tool_calls", "tool_block"]])
            alts.append(["tool_calls"])
        else:
            alts.append(["tool_block"])
    w.rule("reply", alts)
    return w.text("reply", header="// generated by radixchat.grammar.tool_calls")


def compile_tool_call_grammar(
    tools: list[dict], info, tool_choice="auto", *, lenient: bool = False, parallel: bool = True
):
    """Compile the tool-call grammar for the declared ``tools`` (OpenAI-style dicts or plain
    ``{"name", "description", "parameters"}``). See the module docstring for ``tool_choice``."""
    text = tool_call_lark(tools, tool_choice, lenient=lenient, parallel=parallel)
    return CompiledGrammar(text, info, source="<tool calls>", glr=True)
