"""The one exception type users of the grammar package can meet."""

from __future__ import annotations


class GrammarError(ValueError):
    """A grammar, schema or token is not acceptable.

    The message is one line that names what went wrong and where: a JSON pointer for schemas
    (``/properties/age/minimum``), ``file:line`` for Lark grammars, or the token id for a matcher.
    """


class TooManyStates(GrammarError):
    """A grammar's parser would need more states than its limit (``max_states``)."""


class UnenforceableSchema(GrammarError):
    """A JSON Schema uses what the grammar cannot enforce: an unsupported keyword, format or pattern
    construct, or ``oneOf`` branches not provably disjoint. Front ends may offer to run the schema
    leniently instead (``lenient=True``), leaving what is not enforced to a check of the finished reply."""
