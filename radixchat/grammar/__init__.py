"""Grammar-constrained decoding: Lark grammars and JSON Schemas compiled to per-step token masks.

    from radixchat.grammar import TokenizerInfo, compile_grammar, compile_json_schema, GrammarError
    info = TokenizerInfo.from_tokenizer(hf_tokenizer, vocab_size=None)
    g = compile_json_schema(schema, info)      # or compile_grammar("json", info) / Lark text / a path
    m = g.matcher()
    m.allowed(remaining)  # torch.bool [vocab_size]; m.advance(tid); m.is_accepting(); m.is_terminated()

Two layers: the mask engine (``regex``/``dfa``, ``lexer``, ``lalr``, ``compiler``, ``matcher``,
``budget``: grammars and tokens only) and ``schema/`` (JSON Schema and tool calls -> grammar text),
which sits on top of it. The package stands beside the engine and never imports it; a matcher
satisfies the engine's ``TokenMatcher`` protocol. See docs/grammar.md for the design and the formats.
"""

from __future__ import annotations

from .compiler import CompiledGrammar, compile_grammar
from .errors import GrammarError, UnenforceableSchema
from .lint import lint_grammar
from .matcher import GrammarMatcher
from .schema import (
    GrammarWarning,
    ToolCall,
    compile_json_schema,
    compile_tool_call_grammar,
    json_schema_to_lark,
    parse_tool_calls,
    tool_call_lark,
)
from .tokenizer import TokenizerInfo

__all__ = [
    "CompiledGrammar",
    "GrammarError",
    "GrammarMatcher",
    "GrammarWarning",
    "TokenizerInfo",
    "UnenforceableSchema",
    "ToolCall",
    "compile_grammar",
    "compile_json_schema",
    "compile_tool_call_grammar",
    "json_schema_to_lark",
    "lint_grammar",
    "parse_tool_calls",
    "tool_call_lark",
]
