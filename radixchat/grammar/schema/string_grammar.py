"""The ``x-grammar`` schema extension: a JSON string whose *decoded content* follows a Lark grammar.

    {"type": "string", "x-grammar": "start: NUM (OP NUM)*\\nNUM: /[0-9]+/\\nOP: /[-+*\\/]/"}

What a regex cannot say (balanced parentheses) a grammar can. The grammar's rules are embedded in the
generated grammar under fresh names; each terminal becomes a terminal over the string's JSON text
(``json_terminals.encode_ast``: ``"`` as ``\\"``, control characters escaped, ...). Between the quotes
the text is verbatim: the compiler allows no JSON whitespace there (``compiler.VERBATIM_STR``/``_IN``
name the rules). The grammar must lint clean; ``%ignore`` is refused (write the spaces it allows into
its terminals). ``minLength``/``maxLength``/``pattern``/``format`` next to ``x-grammar`` are refused:
bound the length by the grammar itself.
"""

from __future__ import annotations

from lark.exceptions import LarkError
from lark.load_grammar import load_grammar

from .. import regex as rx
from ..compiler import VERBATIM_IN, VERBATIM_STR
from ..errors import GrammarError, UnenforceableSchema
from . import json_terminals as jt
from .lark_text import LarkWriter, lark_string

X_GRAMMAR = "x-grammar"
X_GRAMMAR_START = "x-grammar-start"


def check_string_grammar(text: str, where: str, start: str = "start") -> None:
    """Raise GrammarError (naming ``where``) when the grammar does not build or lint clean."""
    from ..lint import lint_grammar

    if not isinstance(text, str) or not text.strip():
        raise GrammarError(f"{where}: {X_GRAMMAR} must be Lark grammar text")
    try:
        problems = lint_grammar(text, start=start)
    except GrammarError as exc:
        error = UnenforceableSchema if isinstance(exc, UnenforceableSchema) else GrammarError
        raise error(f"{where}: {X_GRAMMAR}: {str(exc).removeprefix('<grammar>: ')}") from None
    if problems:
        raise GrammarError(f"{where}: {X_GRAMMAR}: {problems[0]}")


def embed_string_grammar(w: LarkWriter, text: str, where: str, start: str = "start") -> str:
    """Add rules for a JSON string whose content is a sentence of ``text``; returns the rule's name."""
    check_string_grammar(text, where, start)
    try:
        grammar, _ = load_grammar(text, where, None, False)
        terms, rules, ignore = grammar.compile([start], set())
    except LarkError as exc:  # lint_grammar has already built it; kept for safety
        raise GrammarError(f"{where}: {X_GRAMMAR}: {exc}") from None
    if ignore:
        raise GrammarError(f"{where}: {X_GRAMMAR}: %ignore is not supported (a string's text is verbatim)")
    n = w.new_rule("", where)  # a fresh number for this grammar's names
    names: dict[str, str] = {}
    for t in terms:
        try:
            ast = rx.parse(t.pattern.to_regexp(), f"{where} terminal {t.name}")
            names[t.name] = w.terminal(rx.to_regex(jt.encode_ast(ast)), "XG", where)
        except GrammarError as exc:
            error = UnenforceableSchema if isinstance(exc, UnenforceableSchema) else GrammarError
            raise error(f"{where}: {X_GRAMMAR}: terminal {t.name}: {exc}") from None
    prefix = f"{VERBATIM_IN}{n}_"
    alts: dict[str, list[list[str]]] = {}
    for r in rules:
        body = [names[s.name] if s.is_term else prefix + s.name for s in r.expansion]
        alts.setdefault(prefix + r.origin.name, []).append(body)
    for name, a in alts.items():
        w.rule(name, a)
        w.where[name] = where
    outer = f"{VERBATIM_STR}{n}"
    quote = lark_string('"')
    w.rule(outer, [[quote, prefix + start, quote]])
    w.where[outer] = where
    return outer
