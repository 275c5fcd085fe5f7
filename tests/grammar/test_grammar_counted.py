"""Counted repetitions (grammar.counted): the same language as the unrolled DFA, at a cost that does not
grow with the bound. The oracle is the plain DFA of the same pattern (``compile_regex``)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from grammar_helpers import first_rejection

from radixchat.grammar import RunCache, compile_grammar, compile_json_schema
from radixchat.grammar.counted import CountedDFA, compile_terminal
from radixchat.grammar.dfa import compile_regex
from radixchat.grammar.lexer_space import SPACE
from radixchat.grammar.regex import rep, to_regex
from radixchat.grammar.schema import json_terminals as jt
from radixchat.grammar.schema.lark_text import lark_regex


def length_pattern(lo: int, hi: int | None) -> str:
    """The terminal of ``{"type": "string", "minLength": lo, "maxLength": hi}``."""
    return to_regex(jt.string_terminal(None, lo, hi))


BOUNDS = [(0, 2), (0, 7), (3, 3), (2, 9), (5, None), (0, 40)]
PATTERNS = [length_pattern(lo, hi) for lo, hi in BOUNDS] + [
    to_regex(jt.string_terminal(rep(("set", ((0x61, 0x63),)), 2, 9))),  # "[a-c]{2,9}" as JSON text
    r'"x-[0-9]{1,6}"',  # a prefix of several bytes before the counted class
    r"(?:ab){2,5}\.",  # a multi-byte item
]
PIECES = [
    "a",
    "b",
    "c",
    "0",
    "7",
    "é",
    "😀",
    "東",
    "\\n",
    '\\"',
    "\\u00e9",
    "\\ud83d\\ude00",
    "\\u",
    "x-",
    "ab",
]


def random_text(rng: random.Random, n: int) -> bytes:
    body = "".join(rng.choice(PIECES) for _ in range(n))
    out = rng.choice(['"', '"', "", "x-", '"x-']) + body + rng.choice(['"', '"', ".", "", '""', '"a'])
    data = out.encode()
    if rng.random() < 0.2:  # cut anywhere, even inside a character
        data = data[: rng.randrange(len(data) + 1)]
    return data


def walk(dfa, data: bytes) -> list[int]:
    """The states after each prefix of ``data`` (stops at the first dead byte: -1)."""
    s, out = 0, []
    for b in data:
        s = int(dfa.trans[s][b])
        out.append(s)
        if s < 0:
            break
    return out


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_counted_dfa_accepts_what_the_unrolled_dfa_accepts(pattern):
    counted, plain = compile_terminal(pattern), compile_regex(pattern)
    assert isinstance(counted, CountedDFA)
    rng = random.Random(pattern)
    for _ in range(600):
        data = random_text(rng, rng.randrange(0, 14))
        a, b = walk(counted, data), walk(plain, data)
        assert [s >= 0 for s in a] == [s >= 0 for s in b], data  # the same live prefixes
        for sa, sb in zip(a, b):
            if sa < 0:
                break
            assert bool(counted.accept[sa]) == bool(plain.accept[sb]), data
            assert int(counted.dist[sa]) == int(plain.dist[sb]), data  # budget steering's cost
    assert counted.shortest() == plain.shortest()
    assert plain.matches(counted.example())


@pytest.mark.parametrize("lo,hi", [(0, 5), (2, 4), (3, 3), (4, None)])
def test_lengths_hold_exactly_at_the_bounds(lo, hi):
    d = compile_terminal(length_pattern(lo, hi))
    for n in range(0, 9):
        ok = n >= lo and (hi is None or n <= hi)
        for piece in ("a", "é", "\\n", "\\u00e9", "\\ud83d\\ude00", "😀"):  # escapes count one character
            assert d.matches(('"' + piece * n + '"').encode()) == ok, (piece, n)


def oracle_mask(plain, state: int, info) -> np.ndarray:
    """Tokens that keep the plain DFA alive from ``state`` (the grammar is the terminal alone)."""
    ids = info.text_ids
    lens, starts = info.lens[ids], info.starts[ids]
    cur = np.full(ids.size, state, dtype=np.int64)
    alive = np.ones(ids.size, dtype=bool)
    for k in range(info.max_token_bytes):
        act = np.flatnonzero(alive & (lens > k))
        nxt = plain.trans[cur[act], info.flat[starts[act] + k]]
        cur[act] = np.maximum(nxt, 0)
        alive[act] = nxt >= 0
    ok = np.zeros(info.vocab_size, dtype=bool)
    ok[ids] = alive
    return ok


MASK_CASES = [
    (length_pattern(2, 6), '"', ["a", "é", "😀", "\\n", "\\u00e9", "\\ud83d\\ude00", "ab", "hello "]),
    (length_pattern(0, 3), '"', ["a", "é", "\\u00e9", " "]),
    (r'"x-[0-9]{1,6}"', '"x-', ["0", "1", "42"]),
]


@pytest.mark.parametrize("pattern,start,pieces", MASK_CASES)
def test_masks_of_counted_states_match_the_unrolled_dfa(pattern, start, pieces, smol_info):
    """Every token, from states at each count up to the bound: tokens that straddle the bound (``ab"``
    at one below it), escapes and partial characters (prefixes cut inside one) included."""
    g = compile_grammar(f"start: S\nS: {lark_regex(pattern)}\n", smol_info)
    plain = compile_regex(pattern)
    rng = random.Random(1)
    prefixes = {b"", start[:1].encode()}
    for _ in range(60):
        data = (start + "".join(rng.choice(pieces) for _ in range(rng.randrange(8)))).encode()
        prefixes.add(data[: rng.randrange(len(data) + 1)] if rng.random() < 0.3 else data)
    checked = 0
    for prefix in sorted(prefixes):
        states = walk(plain, prefix)
        if states and states[-1] < 0:
            continue
        state = states[-1] if states else 0
        m = g.matcher()
        if prefix:
            m.advance_bytes(prefix)
        want = oracle_mask(plain, state, smol_info)
        if plain.accept[state]:
            want[list(smol_info.eos_ids)] = True
        assert np.array_equal(m.allowed().numpy(), want), prefix
        checked += 1
    assert checked >= 15


def test_a_max_length_of_10000_builds_no_state_per_count(smol_info, smol_tokenizer):
    before = len(SPACE.comps)
    g = compile_json_schema({"type": "string", "minLength": 9000, "maxLength": 10000}, smol_info, cache=False)
    m = g.matcher()
    m.allowed()
    m.advance(smol_tokenizer.encode('"', add_special_tokens=False)[0])
    m.allowed()
    (d,) = [
        SPACE.dfas[t.dfa] for t in g.tables.terminals.values() if isinstance(SPACE.dfas[t.dfa], CountedDFA)
    ]
    assert d.hi == 10000 and d.lo == 9000
    assert d.n_states < 100
    assert len(SPACE.comps) - before < 100
    assert int(d.dist[0]) == 9002  # budget steering still knows the shortest completion


def test_a_max_length_of_10000_is_exact(smol_info, smol_tokenizer):
    g = compile_json_schema({"type": "string", "maxLength": 10000}, smol_info, cache=False)
    text = "abc é\\n😀" * 1250  # 10,000 characters, escapes and non-ASCII counted once
    assert len(json.loads(json.dumps(text))) == 10000
    assert first_rejection(g, smol_tokenizer.encode(json.dumps(text), add_special_tokens=False)) is None
    ids = smol_tokenizer.encode(json.dumps(text + "a"), add_special_tokens=False)
    assert first_rejection(g, ids) is not None


def test_a_pattern_of_one_counted_class_takes_the_length_bounds(smol_info, smol_tokenizer):
    schema = {"type": "string", "pattern": "^[a-z]+$", "minLength": 3, "maxLength": 2000}
    g = compile_json_schema(schema, smol_info, cache=False)
    ok = first_rejection  # None: accepted
    assert ok(g, smol_tokenizer.encode(json.dumps("ab"), add_special_tokens=False)) is not None
    assert ok(g, smol_tokenizer.encode(json.dumps("abc"), add_special_tokens=False)) is None
    assert ok(g, smol_tokenizer.encode(json.dumps("x" * 2000), add_special_tokens=False)) is None
    assert ok(g, smol_tokenizer.encode(json.dumps("x" * 2001), add_special_tokens=False)) is not None
    assert ok(g, smol_tokenizer.encode(json.dumps("abC"), add_special_tokens=False)) is not None


def test_counted_states_survive_the_disk_cache(smol_info, tmp_path):
    from radixchat.grammar import TokenizerInfo

    g = compile_json_schema(
        {"type": "object", "properties": {"s": {"maxLength": 700}}}, smol_info, cache=False
    )
    m = g.matcher()
    m.advance_bytes(b'{"s":"ab')
    m.allowed()
    lex = m.lex
    (comp,) = SPACE.comps[lex]
    assert isinstance(SPACE.dfas[comp[0]], CountedDFA)
    pattern, key = SPACE.describe(lex)[0]
    assert SPACE.state_of(pattern, json.loads(json.dumps(key))) == comp  # names survive JSON
    path = tmp_path / "cache.npz"
    assert RunCache.of(smol_info).save_cache(path) > 0
    fresh = TokenizerInfo(smol_info.token_bytes, vocab_size=smol_info.vocab_size, eos_ids=smol_info.eos_ids)
    assert RunCache.of(fresh).load_cache(path) > 0
    g2 = compile_json_schema({"type": "object", "properties": {"s": {"maxLength": 700}}}, fresh, cache=False)
    m2 = g2.matcher()
    m2.advance_bytes(b'{"s":"ab')
    assert np.array_equal(m2.allowed().numpy(), m.allowed().numpy())


def test_compiling_builds_the_loop_profiles_so_masks_build_none(smol_info, smol_tokenizer):
    """A counted loop's profile (one vectorised run of the vocabulary, ~10-25 ms) is built when the
    grammar compiles, not inside its first mask (where it was the run's worst stall)."""
    schema = {"type": "string", "pattern": "^[q-u]{3,40}$"}  # a character class no other test uses
    g = compile_json_schema(schema, smol_info, cache=False)
    counted = [d for d in g.dfa_term if isinstance(SPACE.dfas[d], CountedDFA)]
    assert counted
    loops = {SPACE.dfas[d].loop.key for d in counted}
    built = {key for key in RunCache.of(smol_info)._profiles if key[0] in loops}
    assert built  # compiling built them
    before = len(RunCache.of(smol_info)._profiles)
    ids = smol_tokenizer.encode('"qrstuqrstu"', add_special_tokens=False)
    assert first_rejection(g, ids) is None
    assert first_rejection(g, smol_tokenizer.encode('"qrv"', add_special_tokens=False)) is not None
    assert len(RunCache.of(smol_info)._profiles) == before  # the masks built none
