"""Python regular expressions as a small code-point AST, and back to regex text.

Lark hands us terminals as Python regexes. We parse them with the standard library's own parser
(``re._parser``, ``sre_parse`` before 3.11), so the syntax we accept is exactly Python's, and turn the
result into a tiny AST over *code points* that ``dfa.py`` compiles into a byte DFA.

AST nodes are tuples (cheap, hashable):

- ``("set", ranges)``   one code point from sorted, disjoint inclusive ``(lo, hi)`` ranges;
- ``("cat", nodes)``    concatenation (``("cat", ())`` is the empty string);
- ``("alt", nodes)``    alternation;
- ``("rep", node, lo, hi)``  repetition, ``hi`` is None when unbounded;
- ``("look", positive, node)``  a look-ahead; allowed only at the start of a whole pattern, where it
  means "the lexeme itself starts with (does not start with) a match of node".

The language is regular by construction: back-references, anchors, look-behind, possessive
quantifiers and atomic groups raise ``GrammarError``. Matching semantics are *longest match* (the lexer
extends a lexeme while it can); Python's ``re`` is leftmost-first. The two agree for the terminals we
ship and generate; ``lint.lint_grammar`` flags grammars where they could differ.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

from .errors import GrammarError, UnenforceableSchema

# Python's own regex parser and its opcodes (private modules of ``re``, public under their old names
# before 3.11): patterns are parsed exactly as ``re`` parses them. Public here for ``schema``'s patterns.
if sys.version_info >= (3, 11):
    import re._constants as sre_constants
    import re._parser as sre_parse
else:  # pragma: no cover - exercised only on 3.10
    import sre_constants
    import sre_parse

MAX_CP = 0x10FFFF
Ranges = tuple[tuple[int, int], ...]
Node = tuple

EMPTY: Node = ("cat", ())
ALL: Ranges = ((0, MAX_CP),)


# ---------------------------------------------------------------------------------------------------
# Range-set algebra


def norm(ranges) -> Ranges:
    """Sort and merge possibly overlapping ranges."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((a, b) for a, b in out)


def negate(ranges: Ranges) -> Ranges:
    out = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return tuple(out)


def intersect(a: Ranges, b: Ranges) -> Ranges:
    return negate(norm(negate(a) + negate(b)))


def chars(s: str) -> Ranges:
    return norm((ord(c), ord(c)) for c in s)


def lit(text: str) -> Node:
    """A node matching exactly ``text``."""
    return ("cat", tuple(("set", ((ord(c), ord(c)),)) for c in text))


def cat(*nodes: Node) -> Node:
    flat: list[Node] = []
    for n in nodes:
        if n[0] == "cat":
            flat.extend(n[1])
        else:
            flat.append(n)
    return ("cat", tuple(flat)) if len(flat) != 1 else flat[0]


def alt(*nodes: Node) -> Node:
    return ("alt", tuple(nodes)) if len(nodes) != 1 else nodes[0]


def rep(node: Node, lo: int, hi: int | None) -> Node:
    return ("rep", node, lo, hi)


# ---------------------------------------------------------------------------------------------------
# Unicode categories and case folding


@functools.cache
def unicode_category(kind: str) -> Ranges:
    """Code points Python's ``re`` puts in \\d, \\s or \\w (unicode mode), as ranges.

    Computed with ``re`` itself over every code point, so the semantics are exactly Python's.
    """
    everything = "".join(map(chr, range(MAX_CP + 1)))
    rx = {"digit": r"\d+", "space": r"\s+", "word": r"\w+"}[kind]
    return tuple((m.start(), m.end() - 1) for m in re.finditer(rx, everything))


_ASCII_CATS = {
    "digit": chars("0123456789"),
    "space": chars(" \t\n\r\f\v"),
    "word": norm([(48, 57), (65, 90), (97, 122), (95, 95)]),
}


def _category(cat, ascii_only: bool) -> Ranges:
    names = {
        sre_constants.CATEGORY_DIGIT: ("digit", False),
        sre_constants.CATEGORY_NOT_DIGIT: ("digit", True),
        sre_constants.CATEGORY_SPACE: ("space", False),
        sre_constants.CATEGORY_NOT_SPACE: ("space", True),
        sre_constants.CATEGORY_WORD: ("word", False),
        sre_constants.CATEGORY_NOT_WORD: ("word", True),
    }
    if cat not in names:
        raise UnenforceableSchema(f"unsupported regex category {cat}")
    kind, neg = names[cat]
    base = _ASCII_CATS[kind] if ascii_only else unicode_category(kind)
    return negate(base) if neg else base


_CASE_EXPAND_LIMIT = 30000


def casefold(ranges: Ranges) -> Ranges:
    """Add the simple case variants of every code point (as ``re.IGNORECASE`` does).

    Very large sets are returned unchanged: they are (nearly) closed under case already.
    """
    if sum(hi - lo + 1 for lo, hi in ranges) > _CASE_EXPAND_LIMIT:
        return ranges
    extra = []
    for lo, hi in ranges:
        for cp in range(lo, hi + 1):
            c = chr(cp)
            for v in (c.lower(), c.upper(), c.casefold(), unicodedata.normalize("NFC", c.swapcase())):
                if len(v) == 1 and v != c:
                    extra.append((ord(v), ord(v)))
    return norm(ranges + tuple(extra)) if extra else ranges


# ---------------------------------------------------------------------------------------------------
# Parsing


def parse(pattern: str, where: str = "regex") -> Node:
    """Parse a Python regex into the AST. Raises GrammarError naming ``where`` on unsupported syntax."""
    try:
        tree = sre_parse.parse(pattern, 0)
    except re.error as e:
        raise GrammarError(f"{where}: invalid regex {pattern!r}: {e}") from None
    flags = tree.state.flags
    items = list(tree)
    looks: list[Node] = []
    # Leading look-aheads become lexeme-level constraints.
    while items and items[0][0] in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
        op, (direction, sub) = items.pop(0)
        if direction != 1:
            raise GrammarError(f"{where}: look-behind is not supported in {pattern!r}")
        looks.append(("look", op == sre_constants.ASSERT, sre_to_ast(sub, flags, where, pattern)))
    # A trailing negative look-ahead is *right context* (about the text after the lexeme). The byte
    # lexer is greedy and cannot see past the lexeme, so it is not part of the language; generated
    # grammars use it only to make Python's leftmost-first matching pick the longest match.
    while items and items[-1][0] is sre_constants.ASSERT_NOT and items[-1][1][0] == 1:
        items.pop()
    body = sre_to_ast(items, flags, where, pattern)
    return cat(*looks, body) if looks else body


def has_right_context(pattern: str) -> bool:
    """Whether a pattern ends with a look-ahead (right context the byte lexer does not enforce)."""
    try:
        items = list(sre_parse.parse(pattern, 0))
    except re.error:
        return False
    return (
        bool(items)
        and items[-1][0] in (sre_constants.ASSERT, sre_constants.ASSERT_NOT)
        and items[-1][1][0] == 1
    )


def sre_to_ast(items, flags: int, where: str, pattern: str) -> Node:
    """Our AST of ``items``, a sequence ``sre_parse`` returned for ``pattern`` (``where`` names it in
    errors), under ``re`` flags ``flags``."""
    parts: list[Node] = []
    icase = bool(flags & sre_constants.SRE_FLAG_IGNORECASE)
    ascii_only = bool(flags & sre_constants.SRE_FLAG_ASCII)
    for op, av in items:
        if op is sre_constants.LITERAL:
            r = ((av, av),)
            parts.append(("set", casefold(r) if icase else r))
        elif op is sre_constants.NOT_LITERAL:
            r = ((av, av),)
            parts.append(("set", negate(casefold(r) if icase else r)))
        elif op is sre_constants.ANY:
            parts.append(("set", ALL if flags & sre_constants.SRE_FLAG_DOTALL else negate(((10, 10),))))
        elif op is sre_constants.IN:
            parts.append(("set", _conv_in(av, icase, ascii_only, where, pattern)))
        elif op is sre_constants.BRANCH:
            parts.append(alt(*(sre_to_ast(b, flags, where, pattern) for b in av[1])))
        elif op is sre_constants.SUBPATTERN:
            _group, add, delete, sub = av
            parts.append(sre_to_ast(sub, (flags | add) & ~delete, where, pattern))
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            lo, hi, sub = av
            parts.append(
                (
                    "rep",
                    sre_to_ast(sub, flags, where, pattern),
                    lo,
                    None if hi == sre_constants.MAXREPEAT else hi,
                )
            )
        elif op is sre_constants.AT:
            raise GrammarError(f"{where}: anchors are not supported in terminals ({pattern!r})")
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            kind = "look-behind" if av[0] != 1 else "look-ahead"
            raise GrammarError(
                f"{where}: {kind} is only supported at the start of a terminal ({pattern!r}); "
                "common.ESCAPED_STRING: use the STRING of grammars/json.lark"
            )
        else:
            raise UnenforceableSchema(f"{where}: unsupported regex construct {op} in {pattern!r}")
    return cat(*parts) if len(parts) != 1 else parts[0]


def _conv_in(items, icase: bool, ascii_only: bool, where: str, pattern: str) -> Ranges:
    negated = False
    acc: list[tuple[int, int]] = []
    for op, av in items:
        if op is sre_constants.NEGATE:
            negated = True
        elif op is sre_constants.LITERAL:
            acc.append((av, av))
        elif op is sre_constants.RANGE:
            acc.append(av)
        elif op is sre_constants.CATEGORY:
            acc.extend(_category(av, ascii_only))
        else:
            raise UnenforceableSchema(f"{where}: unsupported class item {op} in {pattern!r}")
    r = norm(acc)
    if icase:
        r = casefold(r)
    return negate(r) if negated else r


# ---------------------------------------------------------------------------------------------------
# Serialising back to Python regex text


def _esc(cp: int, in_class: bool) -> str:
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02x}"
    if cp > 0xFFFF:
        return f"\\U{cp:08x}"
    if cp > 0x7E:
        return f"\\u{cp:04x}"
    c = chr(cp)
    return c if c.isalnum() or c == "_" else "\\" + c


def _class(ranges: Ranges) -> str:
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return _esc(ranges[0][0], False)
    neg = ranges[0][0] == 0 and ranges[-1][1] == MAX_CP and len(ranges) > 1
    body = negate(ranges) if neg else ranges
    out = []
    for lo, hi in body:
        if lo == hi:
            out.append(_esc(lo, True))
        elif hi == lo + 1:
            out.append(_esc(lo, True) + _esc(hi, True))
        else:
            out.append(_esc(lo, True) + "-" + _esc(hi, True))
    return ("[^" if neg else "[") + "".join(out) + "]"


def to_regex(node: Node) -> str:
    """Python regex text for an AST (the inverse of ``parse`` up to formatting)."""
    kind = node[0]
    if kind == "set":
        if not node[1]:
            return "[^\\x00-\\U0010ffff]"
        return _class(node[1])
    if kind == "cat":
        return "".join(_group(n) if n[0] == "alt" else to_regex(n) for n in node[1])
    if kind == "alt":
        return "|".join(to_regex(n) for n in node[1])
    if kind == "rep":
        _, sub, lo, hi = node
        inner = to_regex(sub)
        if not (sub[0] == "set" or (sub[0] == "cat" and len(sub[1]) == 1 and sub[1][0][0] == "set")):
            inner = "(?:" + inner + ")"
        if (lo, hi) == (0, None):
            q = "*"
        elif (lo, hi) == (1, None):
            q = "+"
        elif (lo, hi) == (0, 1):
            q = "?"
        elif hi is None:
            q = f"{{{lo},}}"
        elif lo == hi:
            q = f"{{{lo}}}"
        else:
            q = f"{{{lo},{hi}}}"
        return inner + q
    if kind == "look":
        return ("(?=" if node[1] else "(?!") + to_regex(node[2]) + ")"
    raise AssertionError(node)


def _group(node: Node) -> str:
    return "(?:" + to_regex(node) + ")"
