"""The vocabulary's prefix trie and the runs of the whole vocabulary over it (``trie_run``).

A run of every token from a wide lexer state steps each distinct prefix once, one vectorised step per
trie level, and keeps the runs of each first byte's subtree by the state that byte leads to, so states
that differ on a few bytes share the rest (see ``trie_run``).
"""

from __future__ import annotations

import threading
from bisect import bisect_left

import numpy as np

from .dfa_store import untracked
from .lexer_space import DEAD, SPACE, WIDE, bytes_of
from .vocab_runs import BYTE, concat_ranges, run_bytes


class Trie:
    """The vocabulary as a trie of its distinct prefixes, level by level (one level per byte), for
    ``trie_run``: a run of the whole vocabulary steps each distinct prefix once (far fewer than the vocabulary's
    bytes: tokens share prefixes) with one vectorised step per level.

    Level ``d`` (0-based; prefixes of ``d + 1`` bytes) holds ``byte[d]`` (each prefix's last byte),
    ``parent[d]`` (its prefix's index in level ``d - 1``); ``node`` is the global index of each token's
    own prefix (levels concatenated; ``off[d]`` is where level ``d`` starts); ``ids`` the token ids in
    the order of ``node``. The tokens that start with level-0 node ``i``'s byte are ``first[i]`` to
    ``first[i + 1]`` (the vocabulary is sorted), and its subtree holds ``span[d][i]`` to
    ``span[d][i + 1]`` of level ``d``; ``memo`` keeps runs of those subtrees (see ``trie_run``)."""

    __slots__ = (
        "byte",
        "parent",
        "off",
        "node",
        "ids",
        "toks",
        "first",
        "span",
        "memo",
        "memo_size",
        "lock",
        "dead",
        "scratch",
    )

    # tokens' runs kept in ``memo`` (12 bytes each); past it the least recently used subtrees go, a few at
    # a time (clearing it all at once freed many runs' arrays at once, inside one mask)
    MEMO_TOKENS = 4_000_000

    def __init__(self, toks: list[bytes], ids: np.ndarray) -> None:
        n = len(toks)
        lens = np.array([len(t) for t in toks], dtype=np.int64)
        width = int(lens.max()) if n else 0
        mat = np.full((n, width), -1, dtype=np.int16)  # -1 past a token's end: differs from any byte
        buf = np.frombuffer(b"".join(toks), dtype=np.uint8)
        rows = np.repeat(np.arange(n), lens)
        cols = np.arange(buf.size) - np.repeat(np.cumsum(lens) - lens, lens)
        mat[rows, cols] = buf
        # toks is sorted: the tokens sharing a prefix are contiguous, so a prefix of d bytes starts a
        # new node at token i iff i is long enough and shares fewer than d bytes with token i - 1.
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            neq = mat[1:] != mat[:-1]
            lcp[1:] = np.where(neq.any(axis=1), neq.argmax(axis=1), width)
        self.byte: list[np.ndarray] = []
        self.parent: list[np.ndarray] = []
        self.off = [0]
        node = np.zeros(n, dtype=np.int64)
        prev = None
        for d in range(width):
            first = np.flatnonzero((lens > d) & (lcp <= d))
            self.byte.append(mat[first, d].astype(np.uint8))
            self.parent.append(
                np.searchsorted(prev, first, side="right") - 1 if prev is not None else np.zeros(0, np.int64)
            )
            ends = np.flatnonzero(lens == d + 1)
            node[ends] = self.off[-1] + np.searchsorted(first, ends, side="right") - 1
            self.off.append(self.off[-1] + first.size)
            prev = first
        self.node = node
        self.ids = ids
        self.toks = toks  # the tokenizer's own sorted list (``_derive``'s walks bisect it)
        roots = self.byte[0] if width else np.zeros(0, np.uint8)  # tokens are never empty
        self.first = (
            np.r_[np.searchsorted(mat[:, 0], roots.astype(np.int16)), n] if n else np.zeros(1, np.int64)
        )
        self.span = [np.arange(roots.size + 1)] if width else []
        for d in range(1, width):  # a level's nodes are in token order: each subtree's are contiguous
            self.span.append(np.searchsorted(self.parent[d], self.span[-1]))
        # (state << 8 | first byte) -> untracked(final, death, pre): ints and boxes only (``untracked``)
        self.memo: dict[int, np.ndarray] = {}
        self.memo_size = 0
        self.lock = threading.Lock()
        self.dead = np.zeros(int(np.diff(self.first).max()) if n else 0, np.int32)  # DEAD (0), read-only
        self.scratch = threading.local()  # ``_levels``' per-node arrays, one set per thread


def trie_run(
    lex: int, trie: Trie, sel: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``run`` of every token of ``trie`` from the start of their bytes (in the order of ``trie.ids``),
    one distinct prefix at a time; with ``sel`` (level-0 node indices, ascending), of the tokens of
    those subtrees only (``trie.first[i]`` to ``trie.first[i + 1]`` for each, concatenated).

    A token's run after its first byte depends only on the lexer state that byte leads to, so the runs
    of each first byte's subtree are kept by (byte, state): the states inside an open object's key, say,
    differ from the plain string state in the few bytes that continue a declared name, and reuse every
    other subtree (stepping only the subtrees not seen before: a few hundred tokens, not the vocabulary).
    A subtree whose state differs from another's on a few bytes only (``LexerSpace.derive_base``) is
    run from that one and derived (``_derive``)."""
    if not trie.byte:
        empty = np.zeros(0, dtype=np.int32)
        return empty, empty, empty
    if sel is None:
        nodes = np.arange(trie.byte[0].size)
        roots = trie.byte[0]
        after = SPACE.next_states(np.full(roots.size, lex, dtype=np.int32), roots)
    else:  # a few first bytes: stepped one by one (no product state's row is built for them)
        nodes = np.asarray(sel, dtype=np.int64)
        roots = trie.byte[0][nodes]
        after = np.array([SPACE.step(lex, b) for b in roots.tolist()], dtype=np.int32)
    live = np.flatnonzero(after != DEAD).tolist()
    derive = {}  # index in nodes -> the state its subtree is derived for (``_derive``)
    twins: dict[int, list[int]] = {}  # state -> indexes in nodes whose runs are its twin's, renamed
    start_at = after.copy()  # the states runs start from: a twin's, where the memo keeps it
    plan: dict[int, tuple[int, int]] = {}  # state -> (its derivation base or -1, the twin run from)
    for i in live:
        a = int(after[i])
        got = plan.get(a)
        if got is None:
            b = SPACE.derive_base(a)
            got = plan[a] = (b, SPACE.canon(b if b >= 0 else a))
        b, c = got
        if b >= 0:
            derive[i] = a
            after[i] = a = b
        if c != a:
            twins.setdefault(a, []).append(i)
        start_at[i] = c
    keys = (start_at.astype(np.int64) << 8 | roots).tolist()
    found = {keys[i]: trie.memo.get(keys[i]) for i in live}  # held here: the memo may evict them meanwhile
    todo = [i for i in live if found[keys[i]] is None]
    _touch(trie, [k for k, v in found.items() if v is not None])
    sizes = np.diff(trie.first)[nodes]
    starts = np.cumsum(sizes) - sizes  # where each subtree's tokens start in the output
    if sel is None and 2 * len(todo) > len(live):  # mostly new: one run of the whole trie, kept by subtree
        final, death, pre = _levels(trie, nodes, start_at)
        _remember(
            trie, [keys[i] for i in live], sizes[live].tolist(), starts[live].tolist(), (final, death, pre)
        )
    else:
        if todo:
            sub = np.array(todo, dtype=np.int64)
            at = np.cumsum(sizes[sub]) - sizes[sub]
            out = _levels(trie, nodes[sub], start_at[sub])
            found.update(_remember(trie, [keys[i] for i in todo], sizes[sub].tolist(), at.tolist(), out))
        dead = trie.dead
        parts = [
            found[key] if a != DEAD else (dead[:k],) * 3
            for key, a, k in zip(keys, after.tolist(), sizes.tolist())
        ]
        if parts:
            final, death, pre = (np.concatenate([p[j] for p in parts]) for j in range(3))
        else:
            final = death = pre = np.zeros(0, dtype=np.int32)
    first_dies = np.repeat(after == DEAD, sizes)  # tokens whose first byte ends the lexeme (no subtree kept)
    if derive or twins:
        final, death, pre = final.copy(), death.copy(), pre.copy()  # they may be the memo's views
    for a, idx in twins.items():  # a twin's states renamed
        first, table = SPACE.twin_map(a)
        sub = np.array(idx, dtype=np.int64)
        pos = concat_ranges(starts[sub], starts[sub] + sizes[sub])
        for arr in (final, pre):
            x = arr[pos]
            arr[pos] = table[np.where(x == DEAD, 0, x - first + 1)]
    if derive:
        for i, a in derive.items():
            lo = int(trie.first[nodes[i]])
            _derive(trie, a, int(after[i]), lo, lo + int(sizes[i]), final, death, pre, lo - int(starts[i]))
    death[first_dies], pre[first_dies] = 0, lex
    return final, death, pre


def _derive(
    trie: Trie,
    lex: int,
    base: int,
    lo: int,
    hi: int,
    final: np.ndarray,
    death: np.ndarray,
    pre: np.ndarray,
    shift: int = 0,
) -> None:
    """Turn the runs of tokens ``lo:hi`` (one first byte's subtree; at ``lo - shift`` in the arrays)
    after their first byte from lexer state ``base`` into their runs from ``lex``, in place.

    The two states step alike on all bytes but a few (``LexerSpace.diff_bits``: a key family's names'
    next letters), and so do the states they lead to on every other byte: a token's run differs only
    where it ends or dies while the states differ. A walk down the sorted vocabulary follows just the
    bytes they differ on, and writes the tokens it meets; every other token keeps the run it has.
    (Run itself, the subtree of a name's first letter in a key family steps product states, and builds
    a costly row for each.)"""
    toks = trie.toks
    todo = [(lex, base, 1, lo, hi)]
    while todo:
        s, sb, d, lo, hi = todo.pop()
        if s == sb:
            continue
        p = toks[lo][:d]
        a, z = lo - shift, hi - shift
        if len(toks[lo]) == d:  # the tokens that are exactly this prefix (sorted first; maybe several)
            while lo < hi and len(toks[lo]) == d:  # Gemma's byte tokens repeat its one-byte pieces
                final[a], death[a], pre[a] = s, -1, 0
                lo, a = lo + 1, a + 1
            if lo >= hi:
                continue
        bits = SPACE.diff_bits(s, sb)
        if bits.bit_count() > WIDE:  # not narrow: these tokens one byte at a time
            for k in range(lo, hi):
                final[k - shift], death[k - shift], pre[k - shift] = run_bytes(s, toks[k], d)
            continue
        if sb == DEAD:  # the base died before: they die here, but on the bytes walked below
            final[a:z], death[a:z], pre[a:z] = DEAD, d, s
        else:  # those that die here from the base on a byte the states step alike on die after ``s``
            for k in (a + np.flatnonzero(death[a:z] == d)).tolist():
                if not bits >> toks[k + shift][d] & 1:
                    pre[k] = s
        for b in bytes_of(bits):
            pb = p + BYTE[b]
            x = bisect_left(toks, pb, lo, hi)
            y = bisect_left(toks, p + BYTE[b + 1], x, hi) if b < 255 else hi
            if x >= y:
                continue
            ns = SPACE.step(s, b)
            if ns == DEAD:
                u, v = x - shift, y - shift
                final[u:v], death[u:v], pre[u:v] = DEAD, d, s
            else:
                todo.append((ns, SPACE.step(sb, b) if sb != DEAD else DEAD, d + 1, x, y))


def _levels(trie: Trie, roots: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step the subtrees of level-0 nodes ``roots`` (sorted) one level at a time, vectorised, from
    ``states``, the lexer states after their first byte. Returns ``(final, death, pre)`` of the tokens
    of those subtrees, in order (of every token when ``roots`` are all the level-0 nodes; a subtree
    from DEAD reads as never dying: the caller says where its tokens died)."""
    # Only the subtrees' nodes are written, and read. Kept across calls: fresh arrays for a large trie are
    # megabytes of new pages per run, each faulted in (docs/benchmarks.md section 4c).
    out = getattr(trie.scratch, "nodes", None)
    if out is None:
        out = trie.scratch.nodes = np.empty((3, trie.off[-1]), dtype=np.int32)
    out_states, out_deaths, out_pres = out
    ps = states.astype(np.int32)
    pd = np.full(roots.size, -1, dtype=np.int32)
    pp = np.zeros(roots.size, dtype=np.int32)
    out_states[roots], out_deaths[roots], out_pres[roots] = ps, pd, pp
    idx, whole = roots, roots.size == trie.byte[0].size
    for d in range(1, len(trie.byte)):
        if whole:
            nxt, at = None, trie.parent[d]
        else:
            nxt = concat_ranges(trie.span[d][roots], trie.span[d][roots + 1])  # the subtrees' level-d nodes
            if not nxt.size:
                break
            at = np.searchsorted(idx, trie.parent[d][nxt])  # each node's parent among the last level's
        ps, pd, pp = ps[at], pd[at], pp[at]
        data = trie.byte[d] if nxt is None else trie.byte[d][nxt]
        live = ps != DEAD
        n_live = int(np.count_nonzero(live))
        if 4 * n_live >= ps.size:
            cur = SPACE.next_states(ps, data)
        else:  # most of the level's parents died already (a key, a number): step only the others
            cur = np.zeros_like(ps)  # DEAD
            if n_live:
                sel = np.flatnonzero(live)
                cur[sel] = SPACE.next_states(ps[sel], data[sel])
        died = (cur == DEAD) & live
        if died.any():
            pd = np.where(died, d, pd).astype(np.int32)
            pp = np.where(died, ps, pp).astype(np.int32)
        g = slice(trie.off[d], trie.off[d + 1]) if nxt is None else trie.off[d] + nxt
        out_states[g], out_deaths[g], out_pres[g] = cur, pd, pp
        idx, ps = nxt, cur
    node = trie.node if whole else trie.node[concat_ranges(trie.first[roots], trie.first[roots + 1])]
    return out_states[node], out_deaths[node], out_pres[node]


def _remember(trie: Trie, keys: list, sizes: list[int], at: list[int], out: tuple[np.ndarray, ...]) -> dict:
    """Keep the runs of level-0 subtrees by ``keys`` (state << 8 | first byte): each the ``sizes[i]``
    tokens at ``at[i]`` of ``out``, as read-only views in an ``untracked`` box; returns them."""
    final, death, pre = out
    got = {}
    with trie.lock:
        for key, k, a in zip(keys, sizes, at):
            got[key] = run = untracked(final[a : a + k], death[a : a + k], pre[a : a + k])
            if k > Trie.MEMO_TOKENS:
                continue  # never kept: the memo stays within its bound
            memo = trie.memo
            old = memo.pop(key, None)  # another thread's run of the same subtree
            if old is not None:
                trie.memo_size -= old[0].shape[0]
            while trie.memo_size + k > Trie.MEMO_TOKENS:  # the least recently used first, a few at a time
                trie.memo_size -= memo.pop(next(iter(memo)))[0].shape[0]
            memo[key] = run
            trie.memo_size += k
    return got


def _touch(trie: Trie, keys) -> None:
    """Mark memo entries ``keys`` used now (to the end of the memo's order: eviction takes the front)."""
    memo = trie.memo
    with trie.lock:
        for key in keys:
            run = memo.pop(key, None)
            if run is not None:
                memo[key] = run
