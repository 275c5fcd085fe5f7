"""The mask path's fast algorithms against straightforward references: the prefix-trie run of the
vocabulary vs the plain vectorised run, and the grouped / O(1)-per-reduction parser functions vs the
textbook loops they replace."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from radixchat.grammar import RunCache, TokenizerInfo, compile_grammar, compile_json_schema
from radixchat.grammar.counted import CountedDFA, compile_terminal
from radixchat.grammar.lalr_stack import MAX_FORKS, accepts_end, push, push_all, shiftable
from radixchat.grammar.lalr_tables import END
from radixchat.grammar.lexer_space import DEAD, SPACE
from radixchat.grammar.vocab_runs import run
from radixchat.grammar.vocab_trie import trie_run


def _walk_states(g, rng: random.Random, walks: int = 15, steps: int = 40):
    """(stack, lexer state) pairs met on random walks of the matcher over allowed tokens."""
    seen = set()
    for _ in range(walks):
        m = g.matcher()
        for _ in range(steps):
            seen.update(m.configs)
            allowed = np.flatnonzero(m.allowed().numpy()).tolist()
            tid = int(rng.choice(allowed))
            if tid in g.info.eos_ids:
                break
            m.advance(tid)
    return seen


def _assert_trie_matches_run(info: TokenizerInfo, lexes) -> int:
    trie = RunCache.of(info).trie
    n = 0
    for lex in lexes:
        want = run(lex, trie.ids, np.zeros_like(trie.ids), info.flat, info.starts, info.lens)
        got = trie_run(lex, trie)
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)
        n += 1
    return n


def test_the_trie_run_gives_the_vectorised_run(smol_info):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "a+b"},
            "n": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string", "format": "date"}},
            "kind": {"enum": ["alpha", "alps", 7, None]},
        },
        "additionalProperties": {"type": "integer"},
    }
    g = compile_json_schema(schema, smol_info, cache=False)
    lexes = {lx for _, lx in _walk_states(g, random.Random(0))} - {DEAD}
    assert _assert_trie_matches_run(smol_info, sorted(lexes)) > 20
    assert any(len(SPACE.comps[lx]) > 1 for lx in lexes)


def test_the_trie_run_reuses_subtrees_that_agree_after_their_first_byte(smol_info):
    """Inside an open object's key, states differ from each other only in the bytes that continue a
    declared name: each later state steps those subtrees alone, and still gives the plain run."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "nick": {"type": "integer"}},
        "additionalProperties": True,
    }
    g = compile_json_schema(schema, smol_info, cache=False)
    trie = RunCache.of(smol_info).trie
    added = []
    for prefix in (b'{"', b'{"n', b'{"ni', b'{"na', b'{"nam', b'{"x'):
        m = g.matcher()
        m.advance_bytes(prefix)
        ((_, lex),) = m.configs
        before = len(trie.memo)
        assert _assert_trie_matches_run(smol_info, [lex]) == 1
        added.append(len(trie.memo) - before)
    assert max(added[1:]) <= 3, added  # not the ~150 subtrees of the vocabulary's first bytes


def test_the_trie_run_is_right_when_its_memo_fills_and_evicts(smol_info, monkeypatch):
    """Past its bound the memo drops its least recently used subtrees, not everything (clearing it all
    freed ~80 runs' arrays inside one mask); the runs stay right and the memo within its bound."""
    from radixchat.grammar.vocab_trie import Trie

    monkeypatch.setattr(Trie, "MEMO_TOKENS", 2000)  # evicts in each run
    # from an empty memo (restored after): the compile runs some states ahead, and from the memo the
    # other tests left, those runs could all be hits, which evict nothing
    monkeypatch.setattr(RunCache.of(smol_info).trie, "memo", {})
    monkeypatch.setattr(RunCache.of(smol_info).trie, "memo_size", 0)
    schema = {"type": "object", "properties": {"ab": {"type": "string"}}, "additionalProperties": True}
    g = compile_json_schema(schema, smol_info, cache=False)
    lexes = set()
    for prefix in (b'{"', b'{"a', b'{"ab', b'{"q', b'{"ab":"', b'{"ab":"x'):
        m = g.matcher()
        m.advance_bytes(prefix)
        lexes.update(lx for _, lx in m.configs)
    assert _assert_trie_matches_run(smol_info, sorted(lexes)) == len(lexes)
    memo = RunCache.of(smol_info).trie.memo
    assert RunCache.of(smol_info).trie.memo_size == sum(r[0].shape[0] for r in memo.values()) <= 2000
    assert len(memo) > 1  # evicted a few at a time, not emptied
    # a subtree used again moves to the back: the next evictions take others first
    from radixchat.grammar.vocab_trie import _touch

    key = next(iter(memo))
    _touch(RunCache.of(smol_info).trie, [key])
    assert list(memo)[-1] == key


def test_the_trie_run_handles_duplicate_and_prefix_tokens():
    """A vocabulary whose tokens are prefixes of each other, repeated, and contain byte 0."""
    rng = random.Random(3)
    alphabet = b'ab"\\ 0\x00\xc3\xa9'
    toks: list[bytes | None] = [None]  # id 0: EOS
    for _ in range(300):
        toks.append(bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 7))))
    toks += [toks[5], toks[9], b"a", b"aa", b"aaa", b'"', b'"a', b'"a"']
    info = TokenizerInfo(toks, eos_ids=[0])
    g = compile_grammar('start: S ("," S)*\nS: /"[a-z\\\\ ]*"/ | /[0-9]+/\n', info)
    lexes = {lx for _, lx in _walk_states(g, random.Random(1), walks=30, steps=12)} - {DEAD}
    assert _assert_trie_matches_run(info, sorted(lexes)) >= 3


# -- parser functions ------------------------------------------------------------------------------


def _push_reference(tables, stack, term):
    """``push`` as the textbook loop: a new tuple per reduction."""
    actions, gotos, rules = tables.actions, tables.gotos, tables.rules
    lowest = len(stack) - 1
    st = stack
    while True:
        act = actions[st[-1]].get(term)
        if act is None:
            return None, lowest
        if act[0]:
            return st + (act[1],), lowest
        origin, n = rules[act[1]]
        if n:
            st = st[:-n]
            lowest = min(lowest, len(st) - 1)
        st = st + (gotos[st[-1]][origin],)


def _accepts_end_reference(tables, stack):
    actions, gotos, rules = tables.actions, tables.gotos, tables.rules
    lowest = len(stack) - 1
    st = stack
    while True:
        act = actions[st[-1]].get(END)
        if act is None or act[0]:
            return False, lowest
        origin, n = rules[act[1]]
        if n:
            st = st[:-n]
            lowest = min(lowest, len(st) - 1)
        g = gotos[st[-1]].get(origin)
        if g is None:
            return False, lowest
        if g == tables.end:
            return True, lowest
        st = st + (g,)


def _shiftable_reference(tables, stack, terms):
    lowest = len(stack) - 1
    out = set()
    for term in terms:
        sts, low = push_all(tables, stack, term)
        lowest = min(lowest, low)
        if sts:
            out.add(term)
    return out, max(lowest, 0)


# Optional properties in order make a chain of unit reductions as long as the object (the case the
# O(1) reductions are for); the anyOf of overlapping objects makes a general (forked) parse.
_CHAIN = {
    "type": "object",
    "properties": {f"k{i}": {"type": "integer"} for i in range(12)},
    "additionalProperties": False,
}
_FORKED = 'start: "[" (a | b) "]"\na: "x" c ("," a)?\nb: "x" d ("," b)?\nc: | c "y"\nd: | d "y" | d "z"\n'


@pytest.mark.parametrize("source", [_CHAIN, _FORKED], ids=["chain", "forked"])
def test_grouped_and_in_place_parser_steps_match_the_references(smol_info, source):
    if isinstance(source, dict):
        g = compile_json_schema(source, smol_info, cache=False)
    else:
        g = compile_grammar(source, smol_info, glr=True)
        assert g.tables.forks, "the test needs a grammar with conflicts"
    t = g.tables
    stacks = {st for st, _ in _walk_states(g, random.Random(2), walks=25, steps=60)}
    assert len(stacks) > 20 and max(len(st) for st in stacks) > 6
    for st in stacks:
        terms = [n for n in t.actions[st[-1]] if n in t.terminals]
        got, low = shiftable(t, st, terms)
        assert (set(got), low) == _shiftable_reference(t, st, terms)
        if not t.forks:
            for term in list(t.terminals) + [END]:
                assert push(t, st, term) == _push_reference(t, st, term)
            assert accepts_end(t, st) == _accepts_end_reference(t, st)


def test_grouped_shiftable_defers_to_push_all_past_max_forks(smol_info):
    """Where the grouped search meets more than MAX_FORKS stacks, each terminal is decided by push_all
    (which raises for the ones that are too ambiguous), as before."""
    g = compile_grammar('start: s\ns: s s | "x"\n', smol_info, glr=True)
    m = g.matcher()
    m.advance_bytes(b"x" * 6)
    t = g.tables
    for st, _ in m.configs:
        terms = [n for n in t.actions[st[-1]] if n in t.terminals]
        assert (set(shiftable(t, st, terms)[0]), shiftable(t, st, terms)[1]) == _shiftable_reference(
            t, st, terms
        )
    assert MAX_FORKS == 64


def test_moves_read_without_a_row_are_the_row(smol_info):
    """``live_bytes``, ``_move`` (``step`` without a row) and ``cont`` read a state's moves from its
    DFAs without building its 256-entry row (masks built one per key prefix a walk of the vocabulary
    passed, and one per lexeme start a few crossing tokens stepped): they must say what the row says,
    for states whose row is not built yet, products of several terminals included."""
    rng = random.Random(5)
    words = sorted({"".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 10))) for _ in range(60)})
    schema = {
        "type": "object",
        "properties": {w: {"type": "integer"} for w in words[:30]},
        "patternProperties": {"^x[a-c]{2,5}$": {"enum": words[30:]}},
    }
    g = compile_json_schema(schema, smol_info, cache=False)
    fresh = set()
    for lex0 in {
        ctx.lex0 for ctx, _ in [g.context(st, False) for st, _ in _walk_states(g, rng, walks=4, steps=6)]
    }:
        todo = [lex0]
        while todo and len(fresh) < 400:  # every state the key DFAs reach, row or not
            lex = todo.pop()
            if lex in fresh or lex == DEAD:
                continue
            fresh.add(lex)
            # step builds no row
            todo.extend(SPACE.step(lex, b) for b in np.flatnonzero(SPACE.cont(lex)).tolist())
    unbuilt = [lex for lex in sorted(fresh) if SPACE._row_at[lex] < 0]
    assert len(unbuilt) > 50
    assert sum(len(SPACE.comps[lex]) > 1 for lex in unbuilt) > 0
    for lex in unbuilt:
        live = SPACE.live_bytes(lex)
        steps = {b: SPACE._move(lex, b) for b in range(256)}
        cont = SPACE.cont(lex)
        row = np.array(SPACE.row(lex), dtype=np.int32)  # builds it
        np.testing.assert_array_equal(cont, row != DEAD)
        for b, nxt in steps.items():
            assert nxt == row[b], (lex, b)
        assert list(live) == np.flatnonzero(row).tolist(), lex
    # a product of new key DFAs (a state of several terminals): cont from its components
    lex = SPACE.start_state(
        [SPACE.dfa_id(re.escape(f'"zq{w}"')) for w in words[:8]] + [SPACE.dfa_id("[0-9]+")]
    )
    assert SPACE._row_at[lex] < 0 and len(SPACE.comps[lex]) == 9
    cont, live = SPACE.cont(lex), SPACE.live_bytes(lex)
    np.testing.assert_array_equal(cont, np.array(SPACE.row(lex), dtype=np.int32) != DEAD)
    assert list(live) == np.flatnonzero(cont).tolist()
    assert cont[ord('"')] and cont[ord("7")] and not cont[ord("a")]


def _rows_groups_reference(info, lex, ids, offs):
    final, death, pre = run(lex, ids, offs, info.flat, info.starts, info.lens)
    crossing = (death >= 0) & SPACE.accepting_np[pre]
    subs = {}
    for p in np.unique(pre[crossing]).tolist():
        sel = crossing & (pre == p)
        subs[p] = dict(zip(ids[sel].tolist(), death[sel].tolist()))
    return set(ids[final != DEAD].tolist()), subs


def test_rows_groups_of_big_groups_and_equal_rows_are_the_plain_run(smol_info):
    """``rows_groups`` runs a big group's rows only where the state takes their next byte, and shares
    the runs of equal rows met under other keys: both must give what running every row gives."""
    info = smol_info
    texts = info.token_bytes
    space = np.array([i for i, b in enumerate(texts) if b and b[:1] == b" " and len(b) > 1])
    quote = np.array([i for i, b in enumerate(texts) if b and b[:1] == b'"' and len(b) > 1])
    assert space.size > 1000 and quote.size > 20
    cases = [
        (space, np.ones(space.size, dtype=np.int32)),  # after whitespace: "{", a word, digits...
        (quote, np.ones(quote.size, dtype=np.int32)),
        (space, np.zeros(space.size, dtype=np.int32)),  # the same tokens from their first byte
        (space[:40], np.zeros(40, dtype=np.int32)),  # a small group: run whole
    ]
    terms = [
        ["\\{", "\\[", '"', "-?[0-9]+", "true"],
        ["[a-z]+", "[ \\t]+"],
        [":"],
        [","],
        ["[0-9]+(\\.[0-9]+)?"],
    ]
    for k, (ids, offs) in enumerate(cases):
        for names in terms:
            lex = SPACE.start_state([SPACE.dfa_id(t) for t in names])
            want_inside, want_subs = _rows_groups_reference(info, lex, ids, offs)
            for key in [("test-rows", k), ("test-rows-again", k)]:  # the second: the first's run, shared
                inside, subs = RunCache.of(info).rows_groups(key, lex, ids, offs)
                assert set(inside.tolist()) == want_inside, (k, names)
                got = {p: dict(zip(i.tolist(), o.tolist())) for p, i, o, _ in subs}
                assert got == want_subs, (k, names)
    assert (
        sum(
            bool(
                _rows_groups_reference(
                    info,
                    SPACE.start_state([SPACE.dfa_id(t) for t in names]),
                    space,
                    np.ones(space.size, dtype=np.int32),
                )[1]
            )
            for names in terms
        )
        >= 2
    )  # crossing rows met


def test_rows_are_named_by_their_content_even_when_their_crcs_collide(smol_info, monkeypatch):
    """Crossing rows are named by a CRC of their content, and checked against the rows kept under it:
    equal rows share one name, different rows never do, even where every CRC is the same."""
    from radixchat.grammar import run_cache

    digest = RunCache.of(smol_info)._rows_digest
    a = np.arange(300, 700, dtype=np.int64)
    b = a[::-1].copy()
    ones = np.ones(a.size, dtype=np.int32)
    names = {digest(a, ones), digest(b, ones), digest(a, ones + 1)}
    assert len(names) == 3
    assert digest(a[:10], ones[:10]) != digest(b[:10], ones[:10])  # small rows
    assert digest(a.astype(np.int32), ones.astype(np.int64)) == digest(a, ones)
    monkeypatch.setattr(
        run_cache.zlib, "crc32", lambda data: 7
    )  # every CRC the same: only the comparison tells
    c, d = np.arange(10, 410, dtype=np.int64), np.arange(20, 420, dtype=np.int64)
    first, second = digest(c, ones), digest(d, ones)
    assert first != second
    assert digest(c.copy(), ones.copy()) == first and digest(d.copy(), ones) == second


def test_the_caches_keep_no_tracked_object_per_lexer_state(smol_info):
    """What the process-wide caches keep per lexer state and per run must not be an object that the
    garbage collector tracks: each full collection visits every one, and a long run interns tens of
    thousands (a full collection of those landed inside masks as 100-250 ms stalls)."""
    import gc

    rng = random.Random(3)
    words = sorted({"".join(rng.choice("abcdefghij") for _ in range(rng.randint(4, 9))) for _ in range(400)})
    schema = {
        "type": "object",
        "properties": {
            "k": {"enum": words},
            "s": {"type": "string", "pattern": "^[a-f]{2,40}x[0-9]*$"},
            # open objects: key positions derived from the extra key's generic state, extra keys as twins
            "o": {
                "type": "object",
                "properties": {w: {"type": "integer"} for w in words[:30]},
                "additionalProperties": True,
            },
            "p": {
                "type": "object",
                "properties": {w: {"type": "integer"} for w in words[30:50]},
                "additionalProperties": True,
            },
        },
        "required": ["k", "s"],
    }
    warm_up = compile_json_schema({"type": "array", "items": {"enum": ["ab", "cd"]}}, smol_info, cache=False)
    _walk_states(warm_up, rng, walks=2, steps=5)  # module-level caches (regex, Lark) fill once
    # and the compile's caches of its terminals' DFAs (without running any state ahead: the compile
    # below does, and those states count as new)
    from radixchat.grammar import compiler

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiler, "PREPARED_STATES", 0)
        compile_json_schema(schema, smol_info, cache=False)
    del warm_up
    gc.collect()
    gc.collect()  # a tuple of untracked items is untracked by the pass that sees it: twice for nesting
    states, runs, tracked = (
        len(SPACE.comps),
        RunCache.of(smol_info).cached_lexer_states,
        len(gc.get_objects()),
    )
    g = compile_json_schema(schema, smol_info, cache=False)  # the grammar itself goes away after
    _walk_states(g, rng, walks=40, steps=25)
    head = f'{{"k":"{words[0]}","s":"abx1",'
    for key in (
        f'o":{{"{words[0][:3]}',
        f'o":{{"{words[1]}":1,"{words[2][:2]}',
        f'p":{{"{words[31][:4]}',
        'p":{"zq',
    ):
        m = g.matcher()
        m.advance_bytes((head + '"' + key).encode())
        m.allowed()
    del m
    # The long-lived indexes never become tracked, even between collections: a tracked one is walked
    # entry by entry by each full collection (SPACE's index alone was ~300k visits, ~60% of a
    # collection's work after a MaskBench run).
    caches = {
        "SPACE._ids": SPACE._ids,
        "SPACE._live_bytes": SPACE._live_bytes,
        "SPACE._comp_live": SPACE._comp_live,
        "SPACE._acc_shared": SPACE._acc_shared,
        "runs._runs": RunCache.of(smol_info)._runs,
        "runs._groups": RunCache.of(smol_info)._groups,
        "runs.masks": RunCache.of(smol_info).masks,
    }
    new = {  # the key positions' derivation and the twins (fewer entries from these few walks)
        "runs._parts": RunCache.of(smol_info)._parts,
        "trie.memo": RunCache.of(smol_info).trie.memo,
        "SPACE._base_state": SPACE._base_state,
        "SPACE._base_bytes": SPACE._base_bytes,
        "SPACE._generic": SPACE._generic,
        "SPACE._row_diffs": SPACE._row_diffs,
        "SPACE._canon_of": SPACE._canon_of,
        "SPACE._twin_root": SPACE._twin_root,
        "SPACE._twin_maps": SPACE._twin_maps,
        "runs._row_digests": RunCache.of(smol_info)._row_digests,  # crossing rows named by their content
        "runs._row_content": RunCache.of(smol_info)._row_content,
        "runs._row_orders": RunCache.of(smol_info)._row_orders,  # big groups' rows by next byte
    }
    assert [name for name, c in {**caches, **new}.items() if gc.is_tracked(c)] == []
    assert all(len(c) > 10 for c in caches.values()), {name: len(c) for name, c in caches.items()}
    assert all(len(c) > 1 for c in new.values()), str({name: len(c) for name, c in new.items()})
    del g
    gc.collect()
    gc.collect()
    new_states = len(SPACE.comps) - states
    new_runs = RunCache.of(smol_info).cached_lexer_states - runs
    assert new_states > 300 and new_runs > 100  # the walks reached many new lexer states
    # before: three int arrays per lexer state and a LexRun with a list per run (> 3 per state)
    assert len(gc.get_objects()) - tracked < new_states / 10


def test_product_rows_equal_the_moves(smol_info):
    """``row`` of a product state maps the bytes that only one component survives a DFA at a time
    (``_single_ids``) and interns the other columns: every entry must be the state ``_move`` gives. In
    an open object's keys (the extra key, any string but a name, next to the names) and in a product
    of a counted terminal with a plain one."""
    g = compile_json_schema(
        {
            "type": "object",
            "properties": {"qname": {}, "qnap": {}, "qzone": {}},
            "additionalProperties": True,
        },
        smol_info,
        cache=False,
    )
    stack = g.initial_stack
    lex0 = g.context(stack, False)[0].lex0
    counted = SPACE.start_state([SPACE.dfa_id('"[a-q]{0,29}"'), SPACE.dfa_id('"qb+c"')])
    assert any(isinstance(SPACE.dfas[d], CountedDFA) for d, _ in SPACE.comps[counted])
    # two wide terminals: more bytes than ``FEW_SHARED`` that both survive (their columns hashed)
    wide = SPACE.start_state([SPACE.dfa_id('"[a-z]*qz"'), SPACE.dfa_id('"[a-m0-9]+qx"')])
    products = 0
    for text in ['"qname"', '"qnap"', '"qzone"', '"qnz"', '"qbbbc"', '"qbx"', '"abc1qx"']:
        data = text.encode()
        for k in range(len(data)):  # fed byte by byte: ``feed`` and ``step`` build no rows
            lexes = [lex for _, lex in g.feed(stack, lex0, b"{" + data[:k])]
            others = [counted, wide]
            for b in data[:k]:
                others = [SPACE.step(o, b) for o in others]
            for lex in [*lexes, *others]:
                if lex != DEAD and SPACE._row_at[lex] < 0 and len(SPACE.comps[lex]) > 1:
                    products += 1
                    steps = [SPACE._move(lex, c) for c in range(256)]
                    assert list(SPACE.row(lex)) == steps, (text, k)
    assert products >= 9


def test_the_lexer_space_keeps_dfas_as_arrays_not_objects():
    """``DFAStore`` keeps a plain DFA's arrays where the garbage collector does not look, and rebuilds a
    ``ByteDFA`` over them on request: equal to the DFA compiled, past the store's first growth, and with
    no DFA object left alive for the collector to walk (counted DFAs stay objects)."""
    import gc

    from radixchat.grammar.dfa import ByteDFA, compile_regex
    from radixchat.grammar.dfa_store import DFAStore

    store = DFAStore()
    patterns = [f'"qq{i}word"' for i in range(150)] + ['"[a-q]{0,29}"']
    ids = [store.append(compile_terminal(p)) for p in patterns]
    assert ids == list(range(151)) and len(store) == 151
    for d, p in zip(ids[:150], patterns):
        dfa, ref = store[d], compile_regex(p)
        assert isinstance(dfa, ByteDFA) and store.plain[d] and dfa.pattern == p
        np.testing.assert_array_equal(dfa.trans, ref.trans)
        np.testing.assert_array_equal(dfa.accept, ref.accept)
        np.testing.assert_array_equal(dfa.dist, ref.dist)
        assert dfa.matches(p.encode()) and not dfa.matches(b'"qq"')
    assert isinstance(store[150], CountedDFA) and not store.plain[150]
    with pytest.raises(IndexError):
        store[151]
    del dfa, ref
    compile_regex.cache_clear()
    gc.collect()
    kept = {o.pattern for o in gc.get_objects() if type(o) is ByteDFA}
    assert not kept & set(patterns[:150])
    assert store[7].matches(b'"qq7word"')


def test_a_plain_dfas_states_alone_are_numbered_together():
    """The states of one plain DFA alone are interned all at once, as consecutive lexer states, the first
    time one is asked for (by ``intern`` or a row): each keeps its components, its accepting flag and
    its live bytes, and asking again gives the same state."""
    d = SPACE.dfa_id('"qqblock[a-c]x|qqb"')
    dfa = SPACE.dfas[d]
    n = dfa.n_states
    assert all(d << 32 | t in SPACE._comp_live for t in range(n))  # packed when the DFA was made
    first = SPACE.intern(((d, 3),))
    ids = [SPACE.intern(((d, t),)) for t in range(n)]
    assert ids == list(range(ids[0], ids[0] + n)) and first == ids[3]
    assert [SPACE.intern(((d, t),)) for t in range(n)] == ids
    for t, lex in enumerate(ids):
        assert SPACE.comps[lex] == ((d, t),)
        assert SPACE.accepting[lex] == ((d,) if dfa.accept[t] else ())
        assert bool(SPACE.accepting_np[lex]) == bool(dfa.accept[t])
        assert SPACE.is_start[lex] == (t == 0)
        live = np.flatnonzero(dfa.trans[t] >= 0).astype(np.uint8).tobytes()
        assert SPACE.live_bytes(lex) == live
        assert SPACE._live_bits(d, t) == sum(1 << b for b in live)
    # a product's step to this DFA alone lands on the same numbers
    both = SPACE.start_state([d, SPACE.dfa_id('"qqz"')])
    after = both
    for b in b'"qqblockb':
        after = SPACE.step(after, b)
    assert SPACE.comps[after] == ((d, SPACE.comps[after][0][1]),) and after in ids
    assert list(SPACE.row(after)) == [SPACE._move(after, c) for c in range(256)]


def _integer_object(names: list[str], extra: bool, info):
    """A compiled object schema of these integer properties, open (``extra``) or closed."""
    schema = {
        "type": "object",
        "properties": {k: {"type": "integer"} for k in names},
        "additionalProperties": extra,
    }
    return compile_json_schema(schema, info, cache=False)


def test_a_closed_objects_first_key_state_is_walked(smol_info):
    """A closed object with many names starts its key in a state that many bytes continue, but each name
    only one: it is walked (``walkable``), not run vectorised, and the walk gives the vectorised run.
    A string's interior (one terminal, every byte) is not walked."""
    from radixchat.grammar.lexer_space import WIDE
    from radixchat.grammar.vocab_runs import lex_run, walk_run

    names = [f"{c}{w}" for c in "abcdefghijklmnopqrstuvwxyz" for w in ("ox", "oxen", "ird")]
    names += ["__", ".", "?"]  # tokens that close a name and go on (``__":``, ``.",``) cross it
    g = _integer_object(names, False, smol_info)
    lex = g.feed(g.initial_stack, g.context(g.initial_stack, False)[0].lex0, b'{"')[0][1]
    assert len(SPACE.comps[lex]) == len(names) and len(SPACE.live_bytes(lex)) > WIDE
    assert SPACE.walkable(lex)
    # a move from this many terminals reads only those living on the byte: the same as the row's
    assert [SPACE._move(lex, c) for c in range(256)] == list(SPACE.row(lex))
    assert not SPACE.walkable(SPACE.step(SPACE.start_state([SPACE.dfa_id(r'"[^"\\]*"')]), ord('"')))
    info = smol_info
    a = lex_run(lex, info.text_ids, info.flat, info.starts, info.lens)
    b = walk_run(lex, info.sorted_bytes, info.sorted_ids, info.flat, info.starts, info.lens)
    assert dict(zip(a.inside_ids.tolist(), a.inside_final.tolist())) == dict(
        zip(b.inside_ids.tolist(), b.inside_final.tolist())
    )
    assert len(a.inside_ids) > 10

    def crossing(r):
        return {(p, i, o) for p, ids, offs in r.cross for i, o in zip(ids.tolist(), offs.tolist())}

    assert crossing(a) == crossing(b) and crossing(a)


def test_a_key_familys_subtrees_are_derived_from_its_extra_key(smol_info, monkeypatch):
    """In an open object's key the extra key (any string but a name) is wide and the names narrow: the
    subtree of a name's first letter is run from the extra key alone, then walked where a name is still
    alive (``_derive``). It must give the product's own run: tokens that end inside a name, that close
    it and go on (``__":``, ``.",``), and that leave it."""
    import radixchat.grammar.vocab_trie as vocab_trie

    calls = []
    real = vocab_trie._derive
    monkeypatch.setattr(vocab_trie, "_derive", lambda *a: calls.append(a[1]) or real(*a))
    names = ["name", "nick", "nickname", "note", "type", "t", "__", ".", "zz\u00e9"]
    g = _integer_object(names, True, smol_info)
    lexes = set()
    for prefix in (b'{"', b'{"n', b'{"ni', b'{"nick', b'{"t', b'{"_', b'{"zz\xc3', b'{"q'):
        m = g.matcher()
        m.advance_bytes(prefix)
        lexes.update(lx for _, lx in m.configs)
    assert _assert_trie_matches_run(smol_info, sorted(lexes)) == len(lexes)
    assert len(calls) >= 5 and all(len(SPACE.comps[a]) > 1 for a in calls)


def test_a_key_positions_masks_derived_from_its_generic_state_are_exact(
    smol_tokenizer, smol_info, monkeypatch
):
    """Inside an open object's key, a state is the extra key's generic state (past every name) but for a
    few next letters: its mask is the generic state's with those letters' tokens run again
    (``LexerSpace.base``, ``RunCache.lexrun_part``), and a subtree's runs are derived from the
    generic state's (``_derive``). Every mask along instances, byte by byte and token by token, must
    equal the mask of the same grammar compiled with neither (a tokenizer of its own, whose runs step
    every token vectorised)."""
    from radixchat.grammar import TokenizerInfo

    schema = {
        "type": "object",
        "properties": {
            "nick": {"type": "integer"},
            "nickname": {"type": "string"},
            "name": {"type": "integer"},
            'a"b': {"type": "integer"},
            "zz\u00e9": {"type": "integer"},
            "inner": {"type": "object", "properties": {"nickel": {"type": "integer"}}},
        },
        "required": ["nick"],
    }
    texts = [
        '{"nickname":"x","nick":1,"nicknamed":2,"name":3}',
        '{"nick":1,"na":2,"a\\"b":3,"a\\"bc":4,"zz\u00e9":5,"zz\u00e9\u00e9":6}',
        '{"inner":{"nickel":1,"nick":2},"nick":3,"nickel":{"x":[1]}}',
    ]
    kw = {"cache": False, "additional_properties": "true", "property_order": "any"}
    g = compile_json_schema(schema, smol_info, **kw)
    plain = TokenizerInfo(smol_info.token_bytes, vocab_size=smol_info.vocab_size, eos_ids=smol_info.eos_ids)
    byte_ids = {b: i for i, b in enumerate(smol_info.token_bytes) if b is not None and len(b) == 1}

    def masks_along(grammar) -> list[np.ndarray]:
        """Every mask along each text, tokenized by the tokenizer and byte by byte."""
        out = []
        for text in texts:
            for ids in (
                smol_tokenizer.encode(text, add_special_tokens=False),
                [byte_ids[bytes([b])] for b in text.encode()],
            ):
                m = grammar.matcher()
                for t in ids:
                    out.append(m.allowed().numpy().copy())
                    m.advance(t)
                out.append(m.allowed().numpy().copy())
        return out

    with monkeypatch.context() as mp:
        mp.setattr(SPACE, "base", lambda lex: None)
        mp.setattr(SPACE, "derive_base", lambda lex: -1)
        mp.setattr(
            "radixchat.grammar.run_cache.trie_run",
            lambda lex, trie, sel=None: run(
                lex, trie.ids, np.zeros_like(trie.ids), plain.flat, plain.starts, plain.lens
            ),
        )
        want = masks_along(compile_json_schema(schema, plain, **kw))
    calls = []
    real = SPACE.base
    monkeypatch.setattr(SPACE, "base", lambda lex: calls.append(lex) or real(lex))
    got = masks_along(g)
    assert len(got) == len(want) > 200
    for k, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(a, b), k
    assert sum(real(lx) is not None for lx in set(calls)) >= 10  # the derived path ran


def test_extra_keys_past_their_names_run_as_twins(smol_info, monkeypatch):
    """Two open objects' extra keys are different DFAs (each excludes its own names), but past the names
    both are a JSON string's interior: the same future, so one's runs are the other's with its states
    renamed (``LexerSpace.canon``, ``twin_map``). The renamed runs must be the state's own run; a value
    string's interior (other escapes) is not their twin."""
    from radixchat.grammar.vocab_runs import lex_run

    info = smol_info
    states = []
    for names in (["alpha", "beta"], ["gamma", "delta", "x"]):
        g = _integer_object(names, True, info)
        m = g.matcher()
        m.advance_bytes(b'{"zq')
        ((_, lex),) = m.configs
        assert len(SPACE.comps[lex]) == 1
        states.append(lex)
    a, b = states
    assert a != b and SPACE.comps[a][0][0] != SPACE.comps[b][0][0]
    assert SPACE.canon(a) == SPACE.canon(b)
    value = compile_grammar('start: STR\nSTR: /"[^"\\\\]*"/', info)
    m = value.matcher()
    m.advance_bytes(b'"zq')
    assert SPACE.canon(m.configs[0][1]) != SPACE.canon(a)
    renamed = []
    real = SPACE.twin_map
    monkeypatch.setattr(SPACE, "twin_map", lambda lex: renamed.append(lex) or real(lex))
    assert _assert_trie_matches_run(info, [a, b]) == 2
    for lex in (a, b):
        want = lex_run(lex, RunCache.of(info).trie.ids, info.flat, info.starts, info.lens)
        got = RunCache.of(info).lexrun(lex)
        order = np.argsort(got.inside_ids, kind="stable")
        np.testing.assert_array_equal(np.sort(want.inside_ids), got.inside_ids[order])
        np.testing.assert_array_equal(
            want.inside_final[np.argsort(want.inside_ids, kind="stable")], got.inside_final[order]
        )

        def crossing(r):
            return {(p, i, o) for p, ids, offs in r.cross for i, o in zip(ids.tolist(), offs.tolist())}

        assert crossing(got) == crossing(want) and crossing(want)
    assert b in renamed  # b's runs are a's renamed (or both an earlier twin's)


def test_a_schema_compile_leaves_no_cycle_holding_its_rules(smol_info):
    """The object rules' recursive closures held themselves, and through them the writer's rules (~2.7k
    objects a schema): freed only by a full collection, which then took longer. They must go with the
    compile."""
    import gc

    from radixchat.grammar.schema.lark_text import LarkWriter

    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "object", "properties": {"c": {"type": "string"}}, "minProperties": 1},
        },
        "required": ["a"],
    }
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for order in ("schema", "any"):
            compile_json_schema(
                schema, smol_info, cache=False, additional_properties="true", property_order=order
            )
        gc.collect()
        held = [o for o in gc.garbage if isinstance(o, LarkWriter)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert held == []


def _first_tokens_allowed(tok, mask, cases) -> None:
    """Each ``(text, ok)``: the first token of ``text`` is allowed by ``mask`` iff ``ok``."""
    for text, ok in cases:
        assert bool(mask[tok.encode(text, add_special_tokens=False)[0]]) is ok, text


def test_the_compile_runs_each_open_objects_key_states(smol_info, smol_tokenizer):
    """The compile runs, for each open object, the lexer states past its keys' opening quote and past
    each token of its names as the tokenizer would write them (a partial run of the tokens that start
    with the names' next letters): the key masks read them, and they are still exact."""
    names = ["quixotic", "zanzibar"]  # names no other test declares: their lexer states are new here
    assert smol_info.greedy_tokens(b"quixotic") == [b"qu", b"ix", b"otic"]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    g = compile_json_schema(
        schema, smol_info, cache=False, additional_properties="true", property_order="any"
    )
    m = g.matcher()
    m.advance_bytes(b'{"')
    assert m.lex in RunCache.of(smol_info)._parts  # run by the compile, before any mask asked for it
    cases = [('quixotic":', True), ('zanzibar":', True), ('other":', True), ('":', True), ("\n", False)]
    _first_tokens_allowed(smol_tokenizer, m.allowed().numpy(), cases)
    for piece in ["qu", "ix"]:  # past "qu, then past "quix
        m.advance(smol_tokenizer.convert_tokens_to_ids(piece))
        assert m.lex in RunCache.of(smol_info)._parts
    cases = [("otic", True), ("ot", True), ("x", True), ('":', True), ("\n", False)]
    assert all(len(smol_tokenizer.encode(text, add_special_tokens=False)) == 1 for text, _ in cases)
    _first_tokens_allowed(smol_tokenizer, m.allowed().numpy(), cases)
    unprepared = compile_json_schema(
        {"type": "object", "properties": {"quixote": {"type": "integer"}}}, smol_info, cache=False
    )  # closed: no key family, nothing run ahead
    assert unprepared._families == []


def test_the_compile_runs_the_state_inside_a_string_with_a_new_pattern(smol_info, smol_tokenizer):
    """Past the opening quote of a string with a pattern, the state needs a run over the vocabulary:
    the compile runs it, and the mask is exact."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[b-f]{3}qz[0-9]$"}}}
    g = compile_json_schema(schema, smol_info, cache=False)
    m = g.matcher()
    m.advance_bytes(b'{"s":"')
    assert len(SPACE.comps[m.lex]) == 1 and not SPACE.is_start[m.lex]
    assert m.lex in RunCache.of(smol_info)._runs  # run by the compile
    cases = [("b", True), ("bed", True), ("bad", False), ("x", False), ('"', False)]
    assert all(len(smol_tokenizer.encode(text, add_special_tokens=False)) == 1 for text, _ in cases)
    _first_tokens_allowed(smol_tokenizer, m.allowed().numpy(), cases)


def test_the_compile_runs_the_key_state_of_a_union_of_open_objects(smol_info, smol_tokenizer):
    """Where a union of open objects opens, one key state lexes every object's names and extra key
    (no base state: a whole run); the compile runs it, and its mask takes each object's keys."""
    schema = {
        "anyOf": [
            {"type": "object", "properties": {"xylophone": {"type": "integer"}}, "required": ["xylophone"]},
            {"type": "object", "properties": {"yodeller": {"type": "string"}}, "required": ["yodeller"]},
        ]
    }
    g = compile_json_schema(
        schema, smol_info, cache=False, additional_properties="true", property_order="any"
    )
    assert len(g._families) == 2
    m = g.matcher()
    m.advance_bytes(b'{"')
    assert len({d for d, _ in SPACE.comps[m.lex]}) >= 4  # two names, two extra keys
    assert m.lex in RunCache.of(smol_info)._runs  # run by the compile
    cases = [("xy", True), ("y", True), ("other", True), ("\n", False)]
    assert all(len(smol_tokenizer.encode(text, add_special_tokens=False)) == 1 for text, _ in cases)
    _first_tokens_allowed(smol_tokenizer, m.allowed().numpy(), cases)
