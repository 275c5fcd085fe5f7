"""Terminal regexes as byte DFAs: agreement with Python's re, UTF-8, numbers, strings, formats."""

from __future__ import annotations

import random
import re
from decimal import Decimal

import pytest

from radixchat.grammar import GrammarError
from radixchat.grammar.dfa import compile_regex, utf8_sequences
from radixchat.grammar.regex import parse, to_regex
from radixchat.grammar.schema import json_terminals as jt

PATTERNS = [
    jt.STRING_RE,
    jt.NUMBER_RE,
    jt.WS_RE,
    r"(?i:true|null)",
    r"[a-zA-Z_]\w*",
    r"é+|日本|😀?x",
    r"\d{2,4}",
    r"(?:ab|a)c*",
    r"[^\"\\]{1,3}",
    r"(?s:.)+",
]
ALPHABET = [
    '"',
    "a",
    "b",
    "c",
    "x",
    "\\",
    "u",
    "0",
    "9",
    "e",
    "E",
    ".",
    "-",
    "+",
    " ",
    "\n",
    "\t",
    "é",
    "日",
    "本",
    "😀",
    "t",
    "r",
    "U",
    "N",
    "l",
    "_",
    "\x01",
    "/",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_agrees_with_python_fullmatch(pattern):
    rng = random.Random(pattern)
    d = compile_regex(pattern)
    rx = re.compile(pattern)
    for _ in range(2000):
        s = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 7)))
        assert d.matches(s.encode()) == (rx.fullmatch(s) is not None), s
    assert compile_regex(to_regex(parse(pattern))).n_states == d.n_states  # round trip through text


def test_utf8_sequences_encode_exactly_the_range():
    rng = random.Random(0)
    for _ in range(200):
        lo = rng.randint(0, 0x10FFFF)
        hi = min(0x10FFFF, lo + rng.choice([0, 5, 300, 70000]))
        seqs = utf8_sequences(lo, hi)
        for cp in {lo, hi, (lo + hi) // 2}:
            if 0xD800 <= cp <= 0xDFFF:
                continue
            enc = chr(cp).encode()
            assert any(len(s) == len(enc) and all(a <= b <= z for b, (a, z) in zip(enc, s)) for s in seqs)


@pytest.mark.parametrize(
    "pattern, what",
    [
        (r"(a)\1", "unsupported"),
        (r"(?<=a)b", "look-behind"),
        (r"^ab", "anchors"),
        (r"a(?=b)c", "look-ahead"),
        (r"a*", "empty"),
    ],
)
def test_non_regular_or_empty_patterns_are_refused(pattern, what):
    with pytest.raises(GrammarError, match=what):
        compile_regex(pattern)


@pytest.mark.parametrize(
    "lo, lo_strict, hi, hi_strict, integer",
    [
        (0, False, None, False, True),
        (-5, False, 5, True, True),
        (None, False, -3, False, True),
        (1.5, False, 10.25, False, False),
        (-2.5, True, 0, False, False),
        (-100.125, False, -0.5, True, False),
        (0.1, False, 0.1, False, False),
        (None, False, 0, True, False),
    ],
)
def test_bounded_numbers_match_decimal_comparison(lo, lo_strict, hi, hi_strict, integer):
    rng = random.Random(1)
    node = jt.number_terminal(
        None if lo is None else Decimal(str(lo)),
        lo_strict,
        None if hi is None else Decimal(str(hi)),
        hi_strict,
        integer,
        "#",
    )
    pattern = to_regex(node)
    d = compile_regex(pattern)
    python = re.compile(pattern)
    for _ in range(2000):
        s = str(rng.randint(-300, 300)) if integer else f"{rng.uniform(-300, 300):.{rng.randint(0, 3)}f}"
        v = Decimal(s)
        ok = (lo is None or (v > Decimal(str(lo)) if lo_strict else v >= Decimal(str(lo)))) and (
            hi is None or (v < Decimal(str(hi)) if hi_strict else v <= Decimal(str(hi)))
        )
        assert d.matches(s.encode()) == ok, s
        assert (python.match(s) is not None and python.match(s).group() == s) == ok, s  # leftmost = longest


def test_exact_strings_accept_every_json_escaping():
    d = compile_regex(to_regex(jt.exact_string('é"/😀')))
    for text in ['"é\\"/😀"', '"\\u00e9\\"\\/\\ud83d\\ude00"', '"\\u00E9\\"/\\uD83D\\uDE00"']:
        assert d.matches(text.encode()), text
    assert not d.matches(b'"e\\"/"')


def test_string_lengths_count_decoded_characters():
    d = compile_regex(to_regex(jt.string_terminal(None, 2, 3)))
    for text, ok in [
        ('"ab"', True),
        ('"\\ud83d\\ude00x"', True),
        ('"😀é\\n"', True),
        ('"a"', False),
        ('"abcd"', False),
        ('"\\ud83d"', False),
    ]:
        assert d.matches(text.encode()) == ok, text


@pytest.mark.parametrize(
    "fmt, good, bad",
    [
        ("date", ["2024-02-29", "0001-01-01"], ["2023-02-29", "2024-04-31", "0000-01-01"]),
        ("time", ["23:59:60Z", "00:00:00.1+14:00"], ["24:00:00Z", "12:00:00", "12:00:60Z", "22:59:60Z"]),
        (
            "uri",
            ["https://example.com/a?b=c#d", "mailto:x@y.z", "a:%20b"],
            ["a:%", "a:%zz", "a:]", "a:[[", "a:#x#y", "no-scheme"],
        ),
        ("ipv4", ["255.255.255.255"], ["256.0.0.1", "01.2.3.4"]),
        ("ipv6", ["::", "fe80::1:2", "1:2:3:4:5:6:7:8"], ["1:2:3:4:5:6:7:8:9", ":::"]),
        ("uuid", ["00000000-0000-0000-0000-000000000000"], ["0000-0000"]),
    ],
)
def test_formats(fmt, good, bad):
    d = compile_regex(to_regex(jt.string_terminal(jt.format_ast(fmt))))
    for s in good:
        assert d.matches(f'"{s}"'.encode()), s
    for s in bad:
        assert not d.matches(f'"{s}"'.encode()), s


def test_patterns_have_search_semantics_unless_anchored():
    search = compile_regex(to_regex(jt.string_terminal(jt.pattern_ast("b+", "#"))))
    anchored = compile_regex(to_regex(jt.string_terminal(jt.pattern_ast("^b+$", "#"))))
    assert search.matches(b'"abbc"') and not anchored.matches(b'"abbc"')
    assert anchored.matches(b'"bb"')
