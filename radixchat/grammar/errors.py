"""The one exception type users of the grammar package can meet."""

from __future__ import annotations


class GrammarError(ValueError):
    """A grammar, schema or token is not acceptable.

    The message is one line that names what went wrong and where: a JSON pointer for schemas
    (``/properties/age/minimum``), ``file:line`` for Lark grammars, or the token id for a matcher.
    """


class TooManyStates(GrammarError):
    """A grammar's parser would need more states than its limit (``max_states``)."""
