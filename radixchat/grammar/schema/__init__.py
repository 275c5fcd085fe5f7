"""JSON Schemas and declared tools -> Lark grammar text, compiled by the mask engine (``..compiler``).

This package knows JSON Schema; the mask engine around it (regex/DFA, lexer, LALR, compiler, matcher,
budget) knows only grammars and tokens, and never imports this package.
"""

from __future__ import annotations

from .json_schema import GrammarWarning, SchemaCompiler, compile_json_schema, json_schema_to_lark
from .tool_calls import ToolCall, compile_tool_call_grammar, parse_tool_calls, tool_call_lark

__all__ = [
    "GrammarWarning",
    "SchemaCompiler",
    "ToolCall",
    "compile_json_schema",
    "compile_tool_call_grammar",
    "json_schema_to_lark",
    "parse_tool_calls",
    "tool_call_lark",
]
