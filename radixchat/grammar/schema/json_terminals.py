"""Regexes for JSON terminals: strings (lengths, patterns, formats, exact values) and bounded numbers.

Everything here returns a code-point regex AST (``regex.py``) over the *JSON text* (quotes and escapes
included), ready to be written into a Lark grammar with ``regex.to_regex``.

Strings: constraints on the decoded string (``pattern``, ``format``, ``enum``) are translated to the
encoded text: a character may appear literally when JSON allows it, or as an escape (``\\n``,
``\\"``, ``\\uXXXX`` for non-ASCII), so both ``json.dumps(ensure_ascii=True)`` and ``False`` outputs
are accepted. Lengths count decoded characters (a surrogate-pair escape counts one).

Numbers within bounds are built as a digit-comparison automaton and written back as a regex; bounded
numbers have no exponent part.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal

import numpy as np

from .. import regex as rx
from ..dfa import ByteDFA, finish, product
from ..errors import GrammarError, UnenforceableSchema
from ..regex import MAX_CP, Node, Ranges, alt, cat, lit, negate, norm, rep
from .cpdfa import CodepointDFA

HEX = "0123456789abcdefABCDEF"
_SHORT = {0x22: '\\"', 0x5C: "\\\\", 0x08: "\\b", 0x0C: "\\f", 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
SAFE: Ranges = negate(norm([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]))
NON_SURROGATE: Ranges = ((0, 0xD7FF), (0xE000, MAX_CP))

#: Any JSON string (the regex of ``grammars/json.lark``'s STRING).
STRING_RE = (
    r'"(?:[^"\\\x00-\x1f]|\\["\\\/bfnrt]|\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}'
    r'|[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))*"'
)
#: An object key that is not one of the declared names: like STRING_RE, but printable ASCII is never
#: ``\u``-escaped, so a key cannot spell a declared name in another form (the names are excluded in
#: the forms ``encode_set`` gives, which escape only control characters, DEL and non-ASCII).
KEY_STRING_RE = STRING_RE.replace(
    r"\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}",
    r"\\u(?:00[01][0-9a-fA-F]|007[fF]|00[89a-fA-F][0-9a-fA-F]|0[1-9a-fA-F][0-9a-fA-F]{2}"
    r"|[1-9a-cA-Ce-fE-F][0-9a-fA-F]{3}",
)
assert KEY_STRING_RE != STRING_RE
NUMBER_RE = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
INTEGER_RE = r"-?(?:0|[1-9][0-9]*)"
WS_RE = r"[ \t]|\r?\n[ \t]{0,20}"


# ---------------------------------------------------------------------------------------------------
# Strings


def _hex_digit_class(lo: int, hi: int) -> Node:
    chars = set()
    for v in range(lo, hi + 1):
        c = "0123456789abcdef"[v]
        chars.add(c)
        chars.add(c.upper())
    return ("set", norm((ord(c), ord(c)) for c in chars))


def _fixed_range(a: int, b: int, width: int) -> Node:
    """Hex digit strings of exactly ``width`` digits (either case) with value in [a, b]."""
    if width == 1:
        return _hex_digit_class(a, b)
    unit = 16 ** (width - 1)
    a0, ar = divmod(a, unit)
    b0, br = divmod(b, unit)
    if a0 == b0:
        return cat(_hex_digit_class(a0, a0), _fixed_range(ar, br, width - 1))
    parts = []
    if ar == 0:
        first = a0
    else:
        parts.append(cat(_hex_digit_class(a0, a0), _fixed_range(ar, unit - 1, width - 1)))
        first = a0 + 1
    last = b0 if br == unit - 1 else b0 - 1
    if first <= last:
        parts.append(cat(_hex_digit_class(first, last), _fixed_range(0, unit - 1, width - 1)))
    if br != unit - 1:
        parts.append(cat(_hex_digit_class(b0, b0), _fixed_range(0, br, width - 1)))
    return alt(*parts)


_ANY_HEX4 = rep(("set", norm((ord(c), ord(c)) for c in HEX)), 4, 4)
_PAIR = cat(lit("\\u"), _fixed_range(0xD800, 0xDBFF, 4), lit("\\u"), _fixed_range(0xDC00, 0xDFFF, 4))


@functools.lru_cache(maxsize=1 << 16)  # pure; schemas write the same characters over and over
def encode_set(ranges: Ranges, max_escape_ranges: int = 24) -> Node:
    """The JSON-text forms of one decoded character from ``ranges``.

    Literal where JSON allows it; ``\\"``, ``\\\\``, ``\\/`` and the short control escapes; ``\\uXXXX``
    for control characters and non-ASCII characters (when the set is not too fragmented), and
    surrogate-pair escapes when the set contains every supplementary character.
    """
    parts: list[Node] = []
    safe = rx.intersect(ranges, SAFE)
    if safe:
        parts.append(("set", safe))
    for cp, esc in _SHORT.items():
        if any(lo <= cp <= hi for lo, hi in ranges):
            parts.append(lit(esc))
    if any(lo <= 0x2F <= hi for lo, hi in ranges):
        parts.append(lit("\\/"))
    controls = rx.intersect(ranges, ((0, 0x1F), (0x7F, 0x7F)))  # json.dumps escapes DEL too
    escapable = controls + rx.intersect(ranges, ((0x80, 0xD7FF), (0xE000, 0xFFFF)))
    escapable = norm(escapable)
    if escapable and len(escapable) <= max_escape_ranges:
        parts.append(cat(lit("\\u"), alt(*(_fixed_range(lo, hi, 4) for lo, hi in escapable))))
    supplementary = rx.intersect(ranges, ((0x10000, MAX_CP),))
    if supplementary == ((0x10000, MAX_CP),):
        parts.append(_PAIR)
    elif supplementary and sum(b - a + 1 for a, b in supplementary) <= 4096:
        for a, b in supplementary:
            for hi in range(0xD800 + ((a - 0x10000) >> 10), 0xD800 + ((b - 0x10000) >> 10) + 1):
                base = 0x10000 + ((hi - 0xD800) << 10)
                lo_a = max(a, base) - base + 0xDC00
                lo_b = min(b, base + 0x3FF) - base + 0xDC00
                parts.append(
                    cat(lit("\\u"), _fixed_range(hi, hi, 4), lit("\\u"), _fixed_range(lo_a, lo_b, 4))
                )
    if not parts:
        raise GrammarError("empty character set")
    return alt(*parts)


_HEX1 = _hex_digit_class(0, 15)

#: One decoded character of any JSON string, as JSON text (lone surrogate escapes excluded).
ANY_CHAR: Node = alt(
    ("set", SAFE),
    cat(lit("\\"), ("set", rx.chars('"\\/bfnrt'))),
    cat(
        lit("\\u"),
        alt(
            cat(("set", rx.chars("0123456789abcABCefEF")), rep(_HEX1, 3, 3)),
            cat(("set", rx.chars("dD")), ("set", rx.chars("01234567")), rep(_HEX1, 2, 2)),
        ),
    ),
    _PAIR,
)


def encode_ast(node: Node) -> Node:
    """Translate a regex over decoded characters into a regex over their JSON text."""
    kind = node[0]
    if kind == "set":
        return encode_set(node[1])
    if kind == "cat":
        return ("cat", tuple(encode_ast(n) for n in node[1]))
    if kind == "alt":
        return ("alt", tuple(encode_ast(n) for n in node[1]))
    if kind == "rep":
        return ("rep", encode_ast(node[1]), node[2], node[3])
    raise UnenforceableSchema(f"unsupported construct {kind} in a string pattern")


def exact_string(s: str) -> Node:
    """Exactly the JSON string ``s`` (any valid escaping of each character)."""
    return cat(lit('"'), *(encode_set(((ord(c), ord(c)),)) for c in s), lit('"'))


def counted_class(content: Node, min_len: int, max_len: int | None) -> Node | None:
    """``content`` with the length bounds folded in, when it is one counted character class
    (``^[a-z]{1,64}$``: every item is one character, so the bounds intersect); else None."""
    if content[0] != "rep" or content[1][0] != "set":
        return None
    _, item, lo, hi = content
    lo = max(lo, min_len)
    hi = max_len if hi is None else hi if max_len is None else min(hi, max_len)
    if hi is not None and hi < lo:
        return None  # no string fits: left to the look-ahead, which says so
    return rep(item, lo, hi)


def string_terminal(
    content: Node | None = None, min_len: int = 0, max_len: int | None = None, extra: list[Node] | None = None
) -> Node:
    """A JSON string whose decoded text matches ``content`` (any text if None), has a length within
    bounds, and also matches every decoded-level regex in ``extra`` (joined as look-aheads)."""
    looks: list[Node] = []
    if content is None and (min_len or max_len is not None):
        body = cat(lit('"'), rep(ANY_CHAR, min_len, max_len), lit('"'))
    else:
        if min_len or max_len is not None:
            looks.append(cat(lit('"'), rep(ANY_CHAR, min_len, max_len), lit('"')))
        body = cat(lit('"'), encode_ast(content) if content is not None else rep(ANY_CHAR, 0, None), lit('"'))
    for e in extra or []:
        looks.append(cat(lit('"'), encode_ast(e), lit('"')))
    return cat(*(("look", True, n) for n in looks), body) if looks else body


# ---------------------------------------------------------------------------------------------------
# Patterns (ECMA-262 subset, JSON Schema "pattern": unanchored search semantics)


def pattern_ast(pattern: str, where: str) -> Node:
    """Decoded-level AST for a JSON Schema pattern; implicit ``.*`` where it is not anchored."""
    _c, _p = rx.sre_constants, rx.sre_parse
    try:
        tree = _p.parse(pattern, re.ASCII)
    except re.error as e:
        raise GrammarError(f"{where}: invalid pattern {pattern!r}: {e}") from None
    any_text = rep(("set", rx.ALL), 0, None)
    flags = tree.state.flags
    starts = ((_c.AT, _c.AT_BEGINNING), (_c.AT, _c.AT_BEGINNING_STRING))
    ends = ((_c.AT, _c.AT_END), (_c.AT, _c.AT_END_STRING))

    def one(items) -> Node:
        items = list(items)
        head = bool(items) and items[0] in starts
        if head:
            items = items[1:]
        tail = bool(items) and items[-1] in ends
        if tail:
            items = items[:-1]
        body = rx.sre_to_ast(items, flags, where, pattern)
        return cat(*(() if head else (any_text,)), body, *(() if tail else (any_text,)))

    items = list(tree)
    if len(items) == 1 and items[0][0] is _c.BRANCH:
        return alt(*(one(b) for b in items[0][1][1]))
    return one(items)


# ---------------------------------------------------------------------------------------------------
# Formats (decoded-level regexes)

_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    rf"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP}-02-29)"
)
# A leap second (:60) only as 23:59:60 UTC: with other offsets it is valid only at the matching local time,
# which a regex cannot relate; those few are left out rather than allowing :60 at any time.
_TIME = (
    r"(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
    r"|23:59:60(?:\.[0-9]+)?(?:[Zz]|[+-]00:00))"
)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9a-fA-F]{1,4}"
_LS32 = rf"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "|".join(
    [
        rf"(?:{_H16}:){{6}}{_LS32}",
        rf"::(?:{_H16}:){{5}}{_LS32}",
        rf"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
        rf"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
        rf"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
        rf"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
        rf"(?:(?:{_H16}:){{0,6}}{_H16})?::",
    ]
)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*"
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_EMAIL = rf"{_ATEXT}+(?:\.{_ATEXT}+)*@{_HOSTNAME}"
# RFC 3986 characters: "%" only before two hex digits, one "#" (the fragment); IP-literal hosts ("[::1]")
# are left out, so "[" and "]" never appear.
_PCHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})"
_URI = rf"[A-Za-z][A-Za-z0-9+.\-]*:{_PCHAR}*(?:#{_PCHAR}*)?"
# A relative reference (RFC 3986 4.2) without an authority ("//host" refs are left out): a first segment
# without ":" (so it cannot read as a scheme) or an absolute path, then an optional query and fragment.
_SEG = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
_SEG_NC = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})"
_QUERY = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})"
_RELATIVE = rf"(?:{_SEG_NC}+(?:/{_SEG}*)*|/(?:{_SEG}+(?:/{_SEG}*)*)?)?(?:\?{_QUERY}*)?(?:#{_QUERY}*)?"
_POINTER = r"(?:/(?:[^/~]|~[01])*)*"
# RFC 3339 appendix A (ISO 8601 durations).
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DUR_DATE = rf"(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:{_DUR_TIME})?"

FORMATS: dict[str, str] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": rf"{_DATE}[Tt]{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": _EMAIL,
    "ipv4": _IPV4,
    "ipv6": rf"(?:{_IPV6})",
    "hostname": _HOSTNAME,
    "uri": _URI,
    "uri-reference": rf"(?:{_URI}|{_RELATIVE})",
    "json-pointer": _POINTER,
    "relative-json-pointer": rf"(?:0|[1-9][0-9]*)(?:#|{_POINTER})",
    "duration": rf"P(?:{_DUR_DATE}|{_DUR_TIME}|[0-9]+W)",
}
#: Standard formats that validators check but the grammar does not: strict schemas refuse them.
UNENFORCED_FORMATS = frozenset({"regex", "iri", "iri-reference", "idn-email", "idn-hostname", "uri-template"})


@functools.cache
def format_ast(name: str) -> Node:
    return rx.parse(FORMATS[name], f"format {name}")


# ---------------------------------------------------------------------------------------------------
# Bounded numbers

LT, EQ, GT = -1, 0, 1


def _cmp(a: str, b: str) -> int:
    return (a > b) - (a < b)


def _digits(v: Decimal) -> tuple[str, str]:
    """Integer and fraction digits of |v| (no leading/trailing zeros; integer part "0" if zero)."""
    s = format(abs(v), "f")
    ip, _, fp = s.partition(".")
    return ip.lstrip("0") or "0", fp.rstrip("0")


def _magnitude_dfa(bound: Decimal, rels: frozenset[int], integer: bool, out: dict, start: int):
    """Add to ``out`` (state -> {byte: state}) a machine reading an unsigned JSON number and
    accepting iff its comparison with |bound| is in ``rels``. Returns the accepting states."""
    vi, vf = _digits(bound)
    n = len(vi)
    accepting: set[int] = set()
    ids: dict[tuple, int] = {("i0",): start}

    def sid(key: tuple) -> int:
        if key not in ids:
            ids[key] = len(out)
            out[ids[key]] = {}
        return ids[key]

    def int_rel(key: tuple) -> int:
        if key[0] == "z":
            return EQ if vi == "0" else LT
        _, k, rel = key
        return LT if k < n else GT if k > n else rel

    def final(key: tuple) -> int | None:
        kind = key[0]
        if kind in ("z", "i"):
            irel = int_rel(key)
            return LT if irel == EQ and vf else irel
        if kind == "f":
            _, irel, j, rel = key
            if irel != EQ:
                return irel
            if rel != EQ:
                return rel
            return LT if vf[j:].strip("0") else EQ
        return None

    todo = [("i0",)]
    out.setdefault(start, {})
    seen = {("i0",)}
    while todo:
        key = todo.pop()
        s = ids[key]
        nxt: dict[int, tuple] = {}
        kind = key[0]
        if kind == "i0":
            nxt[ord("0")] = ("z",)
            for d in "123456789":
                nxt[ord(d)] = ("i", 1, _cmp(d, vi[0]) if n >= 1 else GT)
        elif kind == "i":
            _, k, rel = key
            for d in "0123456789":
                if k >= n:
                    nk, nrel = n + 1, GT
                else:
                    nk, nrel = k + 1, rel if rel != EQ else _cmp(d, vi[k])
                nxt[ord(d)] = ("i", nk, nrel)
        elif kind == "d":
            _, irel = key
            for d in "0123456789":
                nxt[ord(d)] = ("f", irel, *_frac_step(irel, 0, EQ, d, vf))
        elif kind == "f":
            _, irel, j, rel = key
            for d in "0123456789":
                nxt[ord(d)] = ("f", irel, *_frac_step(irel, j, rel, d, vf))
        if not integer and kind in ("z", "i"):
            nxt[ord(".")] = ("d", int_rel(key))
        for b, k2 in nxt.items():
            t = sid(k2)
            out[s][b] = t
            if k2 not in seen:
                seen.add(k2)
                todo.append(k2)
        f = final(key)
        if f is not None and f in rels:
            accepting.add(s)
    return accepting


def _frac_step(irel: int, j: int, rel: int, d: str, vf: str) -> tuple[int, int]:
    if irel != EQ or rel != EQ:
        return min(j + 1, len(vf) + 1), rel
    ref = vf[j] if j < len(vf) else "0"
    return min(j + 1, len(vf) + 1), _cmp(d, ref)


_ALL = frozenset((LT, EQ, GT))


def _side_dfa(
    pos: tuple[Decimal, frozenset[int]] | None, neg: tuple[Decimal, frozenset[int]] | None, integer: bool
) -> ByteDFA:
    """Signed JSON numbers: unsigned ones tested by ``pos``, ``-`` ones by ``neg`` (None: rejected)."""
    out: dict[int, dict[int, int]] = {0: {}}
    accepting: set[int] = set()
    if pos is not None:
        accepting |= _magnitude_dfa(pos[0], pos[1], integer, out, 0)
    if neg is not None:
        minus = len(out)
        out[minus] = {}
        out[0][ord("-")] = minus
        accepting |= _magnitude_dfa(neg[0], neg[1], integer, out, minus)
    n = len(out)
    trans = np.full((n, 256), -1, dtype=np.int64)
    for s, row in out.items():
        for b, t in row.items():
            trans[s, b] = t
    acc = np.zeros(n, dtype=bool)
    acc[list(accepting)] = True
    return finish(trans, acc)


def number_terminal(
    lo: Decimal | None, lo_strict: bool, hi: Decimal | None, hi_strict: bool, integer: bool, where: str
) -> Node:
    """A JSON number (integer if ``integer``) within the bounds, as a regex AST."""
    if lo is None and hi is None:
        return rx.parse(INTEGER_RE if integer else NUMBER_RE)
    got = _bounded_number(
        None if lo is None else str(lo), lo_strict, None if hi is None else str(hi), hi_strict, integer
    )
    if got is None:
        raise GrammarError(f"{where}: no number satisfies the bounds")
    return got


@functools.lru_cache(maxsize=4096)  # schemas repeat their bounds (money amounts, percentages)
def _bounded_number(
    lo_text: str | None, lo_strict: bool, hi_text: str | None, hi_strict: bool, integer: bool
):
    """``number_terminal``'s AST for bounds given as text (None when no number fits)."""
    lo = None if lo_text is None else Decimal(lo_text)
    hi = None if hi_text is None else Decimal(hi_text)
    zero = Decimal(0)
    dfas: list[ByteDFA] = []
    if lo is not None:
        if lo_strict:
            pos = (lo, frozenset({GT})) if lo >= 0 else (zero, _ALL)
            neg = None if lo >= 0 else (-lo, frozenset({LT}))
        else:
            pos = (lo, frozenset({EQ, GT})) if lo >= 0 else (zero, _ALL)
            neg = (zero, frozenset({EQ})) if lo == 0 else None if lo > 0 else (-lo, frozenset({LT, EQ}))
        dfas.append(_side_dfa(pos, neg, integer))
    if hi is not None:
        if hi_strict:
            pos = (hi, frozenset({LT})) if hi > 0 else None
            neg = (zero, _ALL) if hi > 0 else (-hi, frozenset({GT}))
        else:
            pos = (hi, frozenset({LT, EQ})) if hi >= 0 else None
            neg = (zero, _ALL) if hi >= 0 else (-hi, frozenset({EQ, GT}))
        dfas.append(_side_dfa(pos, neg, integer))
    try:
        d = dfas[0] if len(dfas) == 1 else product(dfas[0], dfas[1], "and")
    except GrammarError as e:
        if "matches nothing" not in str(e):
            raise  # a limit or the deadline: not an answer to cache
        return None
    # The regex from state elimination may list a shorter alternative first ("1" before "150"); the
    # right-context look-ahead makes Python's leftmost-first match the longest, as our lexer does.
    return rx.cat(byte_dfa_to_ast(d), NUMBER_END)


#: Right context of a bounded number: nothing that could continue a JSON number follows it.
NUMBER_END: Node = ("look", False, ("set", rx.chars("0123456789.eE+-")))


def byte_dfa_to_ast(d: ByteDFA) -> Node:
    """Regex AST of an ASCII-only byte DFA (bytes are code points)."""
    c = CodepointDFA()
    for _ in range(d.n_states):
        c.state()
    for s, row in enumerate(d.rows):
        by_target: dict[int, list[int]] = {}
        for b, t in enumerate(row):
            if t >= 0:
                if b >= 0x80:
                    raise AssertionError("byte_dfa_to_ast needs an ASCII DFA")
                by_target.setdefault(t, []).append(b)
        for t, bs in by_target.items():
            c.add(s, t, norm((b, b) for b in bs))
    c.accept = {int(s) for s in np.flatnonzero(d.accept)}
    return c.to_ast()
