"""Grammar-constrained decoding: Lark grammars and JSON Schemas compiled to per-step token masks.

    from radixchat.grammar import TokenizerInfo, compile_grammar, compile_json_schema, GrammarError
    info = TokenizerInfo.from_tokenizer(hf_tokenizer, vocab_size=None)
    g = compile_json_schema(schema, info)      # or compile_grammar("json", info) / Lark text / a path
    m = g.matcher()
    m.allowed(remaining)  # torch.bool [vocab_size]; m.advance(tid); m.is_accepting(); m.is_terminated()

Two layers: the mask engine (grammars and tokens only) and ``schema/`` (JSON Schema and tool calls ->
grammar text), which sits on top of it. The mask engine, from a grammar's text to a mask:

- ``regex``, ``dfa``, ``counted``: terminal patterns -> byte DFAs (``counted``: bounded repetitions
  without unrolling them);
- ``lexer_space`` (its storage in ``dfa_store``): the process-wide lexer states and how bytes step them;
- ``tokenizer`` (``TokenizerInfo``): the vocabulary; ``vocab_runs``, ``vocab_trie``, ``counted_runs``:
  what every token does from one lexer state; ``run_cache`` (``RunCache``): those runs, per tokenizer;
- ``lalr_automaton`` -> ``lalr_tables`` -> ``lalr_stack``: the LALR(1) construction on ints, a grammar's
  tables (read through Lark; ``lark_internals`` isolates Lark's private names), the stack functions a
  parser runs;
- ``compiler`` (``CompiledGrammar``: masks per parser state), ``matcher`` (one output's state),
  ``budget`` (steering toward a completion within a token budget), ``lint``, ``limits``, ``hf``.

The package stands beside the engine and never imports it; a matcher satisfies the engine's
``TokenMatcher`` protocol. See docs/grammar.md for the design and the formats.
"""

from __future__ import annotations

from .compiler import CompiledGrammar, compile_grammar
from .errors import GrammarError, UnenforceableSchema
from .lint import lint_grammar
from .matcher import GrammarMatcher
from .run_cache import RunCache
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
    "RunCache",
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
