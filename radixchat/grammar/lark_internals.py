"""The private names of Lark's grammar loader that we depend on, behind two functions.

``schema.lark_text.LarkWriter.compiled`` builds what Lark's ``load_grammar(text).compile(...)`` returns
for a generated grammar without parsing its text. To be equal to it field by field it must turn
literals into patterns and name anonymous terminals (``"{"`` -> ``LBRACE``) exactly as Lark's loader
does, and Lark has no public API for either: we call its private helpers, here only. A Lark release
that changes them breaks this module alone, and ``tests/grammar/test_grammar_lr.py`` (the built grammar
equals the loaded one) says so.
"""

from __future__ import annotations

from lark.lexer import Pattern, Token
from lark.load_grammar import _TERMINAL_NAMES, _literal_to_pattern


def literal_pattern(kind: str, text: str) -> Pattern:
    """Lark's pattern for a literal of a grammar's text: ``kind`` is ``"STRING"`` for ``"..."`` (with its
    quotes and flags) and ``"REGEXP"`` for ``/.../``."""
    return _literal_to_pattern(Token(kind, text))


def anonymous_terminal_name(value: str) -> str | None:
    """The name Lark gives the anonymous terminal of a string literal's value, if it has a fixed one."""
    return _TERMINAL_NAMES.get(value)
