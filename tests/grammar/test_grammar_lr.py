"""The fast compile paths give what the reference paths give.

- ``lalr_automaton.build_automaton`` (LALR(1) on ints) builds the same tables as Lark's analyser, up to state numbering;
- ``LarkWriter.compiled`` gives what Lark's grammar loader gives for the generated text;
- finite languages get the DFA the subset construction gives (the same DFA up to 400 states, the
  same language beyond); numpy products and distances equal plain Python references.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from lark.load_grammar import load_grammar

from radixchat.grammar import GrammarError
from radixchat.grammar import dfa as dfa_mod
from radixchat.grammar.lalr_tables import Tables, build_tables
from radixchat.grammar.regex import parse
from radixchat.grammar.schema.json_schema import SchemaCompiler

SCHEMAS = [
    {"type": "object", "properties": {k: {"type": "string"} for k in "abcdefgh"}},
    {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "number"}}},
        "required": ["b"],
        "additionalProperties": {"type": "boolean"},
    },
    # overlapping anyOf branches: LALR conflicts kept as forks
    {
        "anyOf": [
            {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "integer"}}},
            {"type": "object", "properties": {"x": {"type": "string"}, "z": {"type": "null"}}},
        ]
    },
    # recursion through $ref, arrays with bounds, enums and consts
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"enum": ["a", "b", 1, None, {"k": [1, 2]}]},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    },
    {"type": "object", "minProperties": 1, "maxProperties": 3, "properties": {"p": {}, "q": {}}},
    {"type": "array", "prefixItems": [{"const": "x"}, {"type": "string", "maxLength": 3}], "minItems": 1},
]

#: Hand-written grammars: nullable chains, left and right recursion, conflicts of both kinds.
GRAMMARS = [
    'start: a b c\na: "x" | \nb: a a | "y"\nc: c "z" | \n',
    'start: e\ne: e "+" e | e "*" e | "(" e ")" | "1"\n',
    'start: s\ns: s s | "x" | \n',
    'start: l\nl: l "," i | i\ni: "a" | "b" opt\nopt: "c" | \n',
    'start: x | y\nx: "a" "b" | "a" z\ny: "a" "b"\nz: "b" | "c"\n',
]


def _isomorphic(a: Tables, b: Tables) -> str | None:
    """Why two tables differ (None: equal up to state numbering)."""
    if a.n_states != b.n_states:
        return f"{a.n_states} vs {b.n_states} states"
    m = {a.start: b.start}
    todo = [a.start]
    while todo:
        p = todo.pop()
        q = m[p]
        if sorted(a.kernels[p]) != sorted(b.kernels[q]):
            return f"kernels {a.kernels[p]} vs {b.kernels[q]}"
        if set(a.actions[p]) != set(b.actions[q]) or set(a.gotos[p]) != set(b.gotos[q]):
            return f"symbols of state {p}"
        pairs = [(a.gotos[p][s], b.gotos[q][s]) for s in a.gotos[p]]
        for sym in a.actions[p]:
            oa = a.forks.get((p, sym), (a.actions[p][sym],))
            ob = b.forks.get((q, sym), (b.actions[q][sym],))
            if len(oa) != len(ob):
                return f"actions on {sym}: {oa} vs {ob}"
            for (sa, xa), (sb, xb) in zip(oa, ob):
                if sa != sb:
                    return f"shift/reduce order on {sym}"
                if sa:
                    pairs.append((xa, xb))
                elif a.rules[xa] != b.rules[xb]:
                    return f"reduce {a.rules[xa]} vs {b.rules[xb]}"
        for xa, xb in pairs:
            if xa in m:
                if m[xa] != xb:
                    return "transitions"
            else:
                m[xa] = xb
                todo.append(xa)
    if len(m) != a.n_states or m[a.end] != b.end:
        return "unreachable states or end"
    return None


def _schema_text(schema) -> tuple[str, SchemaCompiler]:
    comp = SchemaCompiler(schema)
    return comp.lark(), comp


@pytest.mark.parametrize("text", GRAMMARS + [_schema_text(s)[0] for s in SCHEMAS])
def test_fast_lalr_equals_larks(text):
    fast = build_tables(text, glr=True)
    ref = build_tables(text, glr=True, lark_analysis=True)
    assert _isomorphic(fast, ref) is None


def test_fast_lalr_keeps_conflicts_as_forks():
    t = build_tables(GRAMMARS[1], glr=True)
    assert t.forks  # the ambiguous expression grammar forks on "+" and "*"
    assert all(opts[0][0] for (q, sym), opts in t.forks.items() if any(s for s, _ in opts))  # shift first


def test_fast_lalr_state_limit():
    items = " ".join(f'"a{i}"?' for i in range(14))
    with pytest.raises(GrammarError, match="LALR states"):
        build_tables(f"start: {items}\n", max_states=500, glr=True)


def _key(terms, rules, ignore):
    return (
        [
            (t.name, type(t.pattern).__name__, t.pattern.value, tuple(t.pattern.flags), t.priority)
            for t in terms
        ],
        [
            (r.origin.name, tuple((s.name, s.is_term) for s in r.expansion), r.order, r.options.priority)
            for r in rules
        ],
        list(ignore),
    )


@pytest.mark.parametrize("schema", SCHEMAS)
def test_writer_compiles_as_lark_loads(schema):
    text, comp = _schema_text(schema)
    got = comp.w.compiled(comp.start_symbol)
    assert got is not None
    loaded, _ = load_grammar(text, "<t>", None, False)
    assert _key(*got) == _key(*loaded.compile(["start"], set()))


def _subset_dfa(pattern: str) -> dfa_mod.ByteDFA:
    nfa = dfa_mod._NFA()
    s, e = nfa.build(parse(pattern))
    return dfa_mod.finish(*dfa_mod._subset(nfa, s, e), pattern)


def _same_language(a: dfa_mod.ByteDFA, b: dfa_mod.ByteDFA) -> bool:
    for x, y in ((a, b), (b, a)):
        try:
            dfa_mod.product(x, y, "minus")
        except GrammarError as e:
            assert "matches nothing" in str(e)
            continue
        return False
    return True


@pytest.mark.parametrize(
    "pattern",
    ['"name"', '"a(?:\\/|\\\\\\/)b"', '"x"|"xy"|"xyz"|"b"', '"(?:\u041e|\\\\u041[Ee])k"', "ab|cd|abd"],
)
def test_word_dfa_equals_subset_dfa(pattern):
    fast = dfa_mod.compile_node(parse(pattern), pattern)
    ref = _subset_dfa(pattern)
    assert np.array_equal(fast.trans, ref.trans) and np.array_equal(fast.accept, ref.accept)


def test_big_enum_dfa_is_minimal_and_same_language():
    words = [f"{a}{b}-{c}{d}" for a in "ABCDEFGH" for b in "XYZW" for c in "0123456789" for d in "01234"]
    pattern = "|".join(f'"{w}"' for w in words)
    fast = dfa_mod.compile_node(parse(pattern), pattern)
    ref = _subset_dfa(pattern)
    assert ref.n_states > dfa_mod.MINIMISE_LIMIT  # the subset DFA is left unminimised
    assert fast.n_states < ref.n_states
    assert _same_language(fast, ref)
    assert fast.matches(b'"CZ-41"') and not fast.matches(b'"CZ-4"')


def _distances_ref(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    n = trans.shape[0]
    dist = np.full(n, -1, dtype=np.int64)
    rev: list[list[int]] = [[] for _ in range(n)]
    for s, row in enumerate(trans.tolist()):
        for t in set(row):
            if t >= 0:
                rev[t].append(s)
    q = deque(np.flatnonzero(accept).tolist())
    for s in q:
        dist[s] = 0
    while q:
        t = q.popleft()
        for s in rev[t]:
            if dist[s] < 0:
                dist[s] = dist[t] + 1
                q.append(s)
    return dist


def _product_ref(a, b, mode):
    ids = {(0, 0): 0}
    order = [(0, 0)]
    rows, acc = [], []
    k = 0
    while k < len(order):
        sa, sb = order[k]
        k += 1
        row = []
        for byte in range(256):
            na = a.rows[sa][byte]
            nb = b.rows[sb][byte] if sb >= 0 else -1
            if na < 0 or (mode == "and" and nb < 0):
                row.append(-1)
                continue
            j = ids.setdefault((na, nb), len(order))
            if j == len(order):
                order.append((na, nb))
            row.append(j)
        rows.append(row)
        if mode == "and":
            acc.append(bool(a.accept[sa]) and sb >= 0 and bool(b.accept[sb]))
        else:
            acc.append(bool(a.accept[sa]) and not (sb >= 0 and b.accept[sb]))
    return dfa_mod.finish(np.array(rows, dtype=np.int64).reshape(-1, 256), np.array(acc, dtype=bool))


@pytest.mark.parametrize(
    ("p1", "p2"),
    [
        ('"[a-z0-9]{1,40}"', '"(?:[^"\\\\]|\\\\.){0,12}"'),
        ('"(?:[a-z]|\\\\u00e9)+"', '"ab.*"'),
        ("[0-9]+(?:\\.[0-9]+)?", "1[0-9]*|2"),
    ],
)
@pytest.mark.parametrize("mode", ["and", "minus"])
def test_product_and_distances_equal_references(p1, p2, mode):
    a, b = _subset_dfa(p1), _subset_dfa(p2)
    assert np.array_equal(a.dist, _distances_ref(a.trans, a.accept))
    try:
        ref = _product_ref(a, b, mode)
    except GrammarError as e:
        with pytest.raises(GrammarError, match="matches nothing"):
            dfa_mod.product(a, b, mode)
        assert "matches nothing" in str(e)
        return
    got = dfa_mod.product(a, b, mode)
    assert np.array_equal(got.trans, ref.trans) and np.array_equal(got.accept, ref.accept)
    assert np.array_equal(got.dist, _distances_ref(got.trans, got.accept))


def test_the_checks_can_fail():
    a = build_tables(GRAMMARS[0], glr=True)
    b = build_tables('start: a b c\na: "x" | \nb: a a | "y"\nc: "z" c | \n', glr=True)  # right, not left
    assert _isomorphic(a, b) is not None
    assert not _same_language(_subset_dfa('"ab"|"c"'), _subset_dfa('"ab"|"cd"'))
