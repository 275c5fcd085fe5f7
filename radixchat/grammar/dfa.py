"""Byte-level DFAs compiled from the code-point regex AST of ``regex.py``.

A terminal's DFA reads UTF-8 *bytes*, so a lexeme can stop in the middle of a character (byte-level
BPE tokens do). Construction: code-point sets become UTF-8 byte-range sequences, a Thompson NFA is
built over bytes, subset construction yields a DFA, which is trimmed (every live state can still reach
acceptance), minimised when small, and renumbered breadth-first so equal regexes give equal DFAs.

Contracts of ``ByteDFA``:
- state 0 is the start state and no transition ever enters it again, so "at state 0" always means
  "nothing of this lexeme read yet";
- ``trans[s, b]`` is the next state or -1 (dead); every state is co-reachable (can still accept);
- ``dist[s]`` is the length in bytes of the shortest continuation from ``s`` to an accepting state.
"""

from __future__ import annotations

import functools
from array import array

import numpy as np

from .errors import GrammarError
from .limits import check
from .regex import MAX_CP, Node, negate, parse

_LEN_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CP))
MAX_DFA_STATES = 50_000
MINIMISE_LIMIT = 400  # DFAs of at most this many states are minimised (see ``finish``)


def utf8_sequences(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Byte-range sequences whose concatenations are exactly the UTF-8 encodings of [lo, hi].

    Surrogates (U+D800..U+DFFF) have no UTF-8 encoding and are left out.
    """
    out: list[list[tuple[int, int]]] = []
    for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)):
        if a > b:
            continue
        for mn, mx in _LEN_BOUNDS:
            if a <= mx and b >= mn:
                _split(max(a, mn), min(b, mx), out)
    return out


def _split(a: int, b: int, out: list) -> None:
    n = len(chr(a).encode())
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if (a & ~m) != (b & ~m):
            if a & m:
                _split(a, a | m, out)
                _split((a | m) + 1, b, out)
                return
            if (b & m) != m:
                _split(a, (b & ~m) - 1, out)
                _split(b & ~m, b, out)
                return
    out.append(list(zip(chr(a).encode(), chr(b).encode())))


class _NFA:
    """Thompson NFA over bytes: ``edges[s]`` = [(lo, hi, t)], ``eps[s]`` = [t]."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[int, int, int]]] = []
        self.eps: list[list[int]] = []

    def new(self) -> int:
        self.edges.append([])
        self.eps.append([])
        if len(self.edges) > 40 * MAX_DFA_STATES:
            raise GrammarError("regex too large (NFA over 2,000,000 states)")
        return len(self.edges) - 1

    def build(self, node: Node) -> tuple[int, int]:
        kind = node[0]
        if kind == "set":
            return self._set(node[1])
        if kind == "cat":
            s = e = self.new()
            for sub in node[1]:
                a, b = self.build(sub)
                self.eps[e].append(a)
                e = b
            return s, e
        if kind == "alt":
            s, e = self.new(), self.new()
            for sub in node[1]:
                a, b = self.build(sub)
                self.eps[s].append(a)
                self.eps[b].append(e)
            return s, e
        if kind == "rep":
            _, sub, lo, hi = node
            s = e = self.new()
            for _ in range(lo):
                a, b = self.build(sub)
                self.eps[e].append(a)
                e = b
            if hi is None:
                a, b = self.build(sub)
                loop = self.new()
                self.eps[e].append(loop)
                self.eps[loop].append(a)
                self.eps[b].append(loop)
                return s, loop
            end = self.new()
            for _ in range(hi - lo):
                self.eps[e].append(end)
                a, b = self.build(sub)
                self.eps[e].append(a)
                e = b
            self.eps[e].append(end)
            return s, end
        if kind == "look":
            raise GrammarError("look-ahead is only supported at the start of a terminal")
        raise AssertionError(node)

    def _set(self, ranges) -> tuple[int, int]:
        s, e = self.new(), self.new()
        # Share prefixes of the byte sequences (a small trie) to keep the NFA compact.
        trie: dict[tuple[int, tuple[int, int]], int] = {}
        for seq in _range_sequences(ranges):
            cur = s
            for i, (blo, bhi) in enumerate(seq):
                if i == len(seq) - 1:
                    self.edges[cur].append((blo, bhi, e))
                else:
                    key = (cur, (blo, bhi))
                    nxt = trie.get(key)
                    if nxt is None:
                        nxt = trie[key] = self.new()
                        self.edges[cur].append((blo, bhi, nxt))
                    cur = nxt
        return s, e


@functools.lru_cache(maxsize=1 << 14)
def _range_sequences(ranges) -> tuple:
    """``utf8_sequences`` of every range of a set (cached: an unrolled repetition builds its set once
    per copy)."""
    return tuple(tuple(seq) for lo, hi in ranges for seq in utf8_sequences(lo, hi))


class ByteDFA:
    """A trimmed byte DFA (see the module docstring for its contracts)."""

    __slots__ = ("trans", "accept", "dist", "_rows", "pattern")

    def __init__(self, trans: np.ndarray, accept: np.ndarray, pattern: str = "") -> None:
        self.trans = trans
        self.accept = accept
        self.pattern = pattern
        self.dist = _distances(trans, accept)
        self._rows: list[array] | None = None

    @classmethod
    def of(cls, trans: np.ndarray, accept: np.ndarray, dist: np.ndarray, pattern: str) -> ByteDFA:
        """A DFA over arrays kept elsewhere (``dfa_store.DFAStore``), without computing its distances again."""
        dfa = cls.__new__(cls)
        dfa.trans, dfa.accept, dfa.dist, dfa.pattern, dfa._rows = trans, accept, dist, pattern, None
        return dfa

    @property
    def rows(self) -> list[array]:
        """``trans`` as one int array per state, built on first use (a big DFA's rows cost more than the
        DFA, and most are never read). Arrays, not lists of ints: the garbage collector visits each
        array once, not each int (lists of the process's DFAs held millions of int references)."""
        if self._rows is None:
            t32 = np.ascontiguousarray(self.trans, dtype=np.int32)
            self._rows = [array("i", r.tobytes()) for r in t32]
        return self._rows

    @property
    def n_states(self) -> int:
        return int(self.trans.shape[0])

    def matches(self, data: bytes) -> bool:
        s = 0
        rows = self.rows
        for b in data:
            s = rows[s][b]
            if s < 0:
                return False
        return bool(self.accept[s])

    def is_empty(self) -> bool:
        return self.n_states == 0

    def shortest(self) -> int:
        return int(self.dist[0]) if self.n_states else -1

    def example(self) -> bytes:
        """One shortest accepted byte string (for error messages and tests)."""
        out = bytearray()
        s = 0
        while not self.accept[s]:
            for b in range(256):
                t = self.rows[s][b]
                if t >= 0 and self.dist[t] == self.dist[s] - 1:
                    out.append(b)
                    s = t
                    break
        return bytes(out)


_WEIGHTS = np.random.default_rng(0x5EED).random(1 << 16) + 0.5


def _byte_classes(trans: np.ndarray) -> np.ndarray:
    """One byte of each distinct column of ``trans`` (bytes that every state treats alike form a class),
    in increasing order: the first byte of each class. Columns are grouped by a hash (a random linear
    form), then checked."""
    n = trans.shape[0]
    if n == 0:
        return np.zeros(1, dtype=np.int64)
    w = _WEIGHTS[:n] if n <= len(_WEIGHTS) else np.random.default_rng(n).random(n) + 0.5
    h = w @ trans
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    if not (trans == trans[:, first[inv.reshape(-1)]]).all():  # a hash collision: group exactly
        _, first = np.unique(trans, axis=1, return_index=True)
    return np.sort(first)


def _distances(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """Shortest distance in bytes from each state to acceptance (-1: none): a backward breadth-first
    search over the distinct columns, one layer at a time in numpy."""
    n = trans.shape[0]
    dist = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return dist
    cols = trans[:, _byte_classes(trans)]
    dst = cols.reshape(-1).astype(np.int64)
    src = np.repeat(np.arange(n, dtype=np.int64), cols.shape[1])
    keep = dst >= 0
    dst, src = dst[keep], src[keep]
    order = np.argsort(dst, kind="stable")
    dst, src = dst[order], src[order]
    indptr = np.searchsorted(dst, np.arange(n + 1))
    frontier = np.flatnonzero(accept)
    dist[frontier] = 0
    d = 0
    while frontier.size:
        d += 1
        starts = indptr[frontier]
        counts = indptr[frontier + 1] - starts
        total = int(counts.sum())
        if not total:
            break
        offsets = np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(total)
        preds = src[offsets]
        preds = np.unique(preds[dist[preds] < 0])
        dist[preds] = d
        frontier = preds
    return dist


def _subset(nfa: _NFA, start: int, final: int) -> tuple[np.ndarray, np.ndarray]:
    bounds = {0, 256}
    for es in nfa.edges:
        for lo, hi, _ in es:
            bounds.add(lo)
            bounds.add(hi + 1)
    cuts = sorted(bounds)
    byte_class = np.zeros(256, dtype=np.int64)
    for i in range(len(cuts) - 1):
        byte_class[cuts[i] : cuts[i + 1]] = i
    n_classes = len(cuts) - 1
    cls = byte_class.tolist()

    closure_memo: dict[frozenset, frozenset] = {}

    def closure(states) -> frozenset:
        key = frozenset(states)
        got = closure_memo.get(key)
        if got is not None:
            return got
        seen = set(key)
        stack = list(key)
        while stack:
            s = stack.pop()
            for t in nfa.eps[s]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        # Keep only states that matter: those with byte edges, and the final state.
        res = frozenset(s for s in seen if nfa.edges[s] or s == final)
        closure_memo[key] = res
        return res

    init = closure([start])
    ids = {init: 0}
    order = [init]
    rows: list[list[int]] = []
    i = 0
    while i < len(order):
        cur = order[i]
        i += 1
        buckets: list[set[int] | None] = [None] * n_classes
        for s in cur:
            for lo, hi, t in nfa.edges[s]:
                for c in range(cls[lo], cls[hi] + 1):
                    b = buckets[c]
                    if b is None:
                        buckets[c] = {t}
                    else:
                        b.add(t)
        row = []
        for b in buckets:
            if b is None:
                row.append(-1)
                continue
            tgt = closure(b)
            j = ids.get(tgt)
            if j is None:
                j = ids[tgt] = len(order)
                order.append(tgt)
                if len(order) > MAX_DFA_STATES:
                    raise GrammarError(f"regex too large (DFA over {MAX_DFA_STATES} states)")
                if not len(order) & 255:
                    check()
            row.append(j)
        rows.append(row)
    class_rows = np.array(rows, dtype=np.int64).reshape(len(rows), n_classes)
    trans = class_rows[:, byte_class]
    accept = np.array([final in st for st in order], dtype=bool)
    return trans, accept


def finish(trans: np.ndarray, accept: np.ndarray, pattern: str = "") -> ByteDFA:
    """Trim, minimise (when small), make the start state non-re-enterable, renumber BFS-wise."""
    n = trans.shape[0]
    # Co-reachability: states from which an accepting state can be reached.
    dist = _distances(trans, accept)
    live = dist >= 0
    if n == 0 or not live[0]:
        raise GrammarError(f"regex {pattern!r} matches nothing")
    t = np.where((trans >= 0) & live[np.clip(trans, 0, None)], trans, -1)
    if (
        n <= MINIMISE_LIMIT
    ):  # Moore refinement is quadratic-ish; large DFAs from counted repeats are near-minimal
        labels, rep, _ = _minimise(t, accept, live)
        t = np.where(t[rep] >= 0, labels[np.clip(t[rep], 0, None)], -1)
        accept = accept[rep]
        start = int(labels[0])
    else:
        start = 0
    # Renumber reachable states from start, BFS order; split the start state if re-entered. Each
    # state's targets are visited once each, in byte order (``dict.fromkeys``), and the rows are then
    # renamed with one array lookup.
    rows = t[:, _byte_classes(t)].tolist()  # one column per byte class, in byte order
    reentered = bool((t == start).any())
    order = [start]
    ids: dict = {("s", start): 0} if reentered else {start: 0}
    k = 0
    while k < len(order):
        for nxt in dict.fromkeys(rows[order[k]]):
            if nxt >= 0 and nxt not in ids:
                ids[nxt] = len(order)
                order.append(nxt)
        k += 1
    rename = np.full(t.shape[0] + 1, -1, dtype=np.int64)  # index s + 1; -1 stays -1
    for s, j in ids.items():
        if not isinstance(s, tuple):
            rename[s + 1] = j
    new_trans = rename[t[order] + 1].astype(np.int32).reshape(-1, 256)
    return ByteDFA(new_trans, np.asarray(accept, dtype=bool)[order].copy(), pattern)


def _minimise(t: np.ndarray, accept: np.ndarray, live: np.ndarray):
    """Moore partition refinement; returns (trans, accept, start) over the blocks."""
    n = t.shape[0]
    t = np.unique(t, axis=1)  # equal byte columns carry the same information
    labels = np.where(live, accept.astype(np.int64), -2)
    n_blocks = len(np.unique(labels))
    while True:
        tgt = np.where(t >= 0, labels[np.clip(t, 0, None)], -1)
        sig = np.concatenate([labels[:, None], tgt], axis=1)
        _, new = np.unique(sig, axis=0, return_inverse=True)
        new = new.reshape(-1)
        k = int(new.max()) + 1 if n else 0
        labels = new
        if k == n_blocks:
            break
        n_blocks = k
    rep = np.zeros(n_blocks, dtype=np.int64)
    rep[labels[::-1]] = np.arange(n - 1, -1, -1)  # first member of each block
    return labels, rep, n_blocks


def product(a: ByteDFA, b: ByteDFA, mode: str, pattern: str = "") -> ByteDFA:
    """Intersection (``mode="and"``) or difference (``"minus"``) of two DFAs' languages.

    Breadth-first over pairs of states, one layer at a time in numpy (a pattern under a length bound
    is a product of some 10,000 states)."""
    # For "minus", b is completed with a dead sink (row nb: -1 everywhere, never accepting).
    both = mode == "and"
    ta = a.trans.astype(np.int64)
    nb = b.n_states
    width = nb + 1
    tb = np.concatenate([b.trans.astype(np.int64), np.full((1, 256), -1, dtype=np.int64)])
    acc_b = np.concatenate([b.accept.astype(bool), [False]])
    ids: dict[int, int] = {0: 0}  # pair key sa * width + sb (sb = nb: b is dead) -> state
    frontier = np.zeros(1, dtype=np.int64)
    rows: list[np.ndarray] = []
    accs: list[np.ndarray] = []
    while frontier.size:
        check()
        sa, sb = frontier // width, frontier % width
        na, nxt_b = ta[sa], tb[sb]
        valid = (na >= 0) & (nxt_b >= 0) if both else na >= 0
        keys = np.where(valid, na * width + np.where(nxt_b >= 0, nxt_b, nb), -1)
        rows.append(keys)
        accs.append(a.accept[sa] & (acc_b[sb] if both else ~acc_b[sb]))
        flat = keys.reshape(-1)
        uniq, first = np.unique(flat, return_index=True)
        fresh = [k for k in uniq[np.argsort(first)].tolist() if k >= 0 and k not in ids]
        for k in fresh:
            ids[k] = len(ids)
        if len(ids) > MAX_DFA_STATES:
            raise GrammarError(f"terminal {pattern!r} too large")
        frontier = np.array(fresh, dtype=np.int64)
    keys = np.concatenate(rows)
    known = np.fromiter(ids.keys(), dtype=np.int64, count=len(ids))
    order = np.argsort(known)
    known = known[order]
    state = np.fromiter(ids.values(), dtype=np.int64, count=len(ids))[order]
    pos = np.clip(np.searchsorted(known, keys), 0, len(known) - 1)
    trans = np.where(keys >= 0, state[pos], -1)
    return finish(trans, np.concatenate(accs), pattern)


def _prefix_closed(d: ByteDFA) -> ByteDFA:
    """The DFA of L(d)·Σ*: once accepting, stay accepting on any byte."""
    trans = d.trans.astype(np.int64).copy()
    acc_states = np.flatnonzero(d.accept)
    trans[acc_states, :] = acc_states[:, None]
    return finish(trans, d.accept.copy())


def compile_node(node: Node, pattern: str = "") -> ByteDFA:
    """Compile an AST (with optional leading look-aheads) to a finished ByteDFA."""
    looks: list[tuple[bool, Node]] = []
    body = node
    if node[0] == "cat":
        items = list(node[1])
        while items and items[0][0] == "look":
            looks.append((items[0][1], items[0][2]))
            items.pop(0)
        body = ("cat", tuple(items))
    elif node[0] == "look":
        raise GrammarError(f"terminal {pattern!r} is only a look-ahead")
    dfa = _finished(body, pattern)
    for positive, sub in looks:
        try:
            other = _look_dfa(sub)
        except GrammarError:  # not cached: again, for the message naming the pattern
            other = _prefix_closed(_finished(sub, pattern))
        dfa = product(dfa, other, "and" if positive else "minus", pattern)
    return dfa


@functools.lru_cache(maxsize=256)
def _look_dfa(node: Node) -> ByteDFA:
    """A look-ahead's DFA, closed under any continuation (cached by its AST: a length bound next to a
    pattern is the same look-ahead ``"(?:char){lo,hi}"`` in every schema with those bounds)."""
    return _prefix_closed(_finished(node, ""))


def _finished(node: Node, pattern: str) -> ByteDFA:
    """``finish`` of the subset construction of ``node``'s NFA; for a finite language of a few
    thousand words (object keys, enums of strings: most generated terminals), its minimal DFA built
    directly (``_words_dfa``)."""
    words = _words(node)
    if words is not None:
        got = _words_dfa(words, pattern)
        if got is not None:
            return got
    nfa = _NFA()
    s, e = nfa.build(node)
    return finish(*_subset(nfa, s, e), pattern)


_MAX_WORDS = 1 << 15


def _words(node: Node) -> list[bytes] | None:
    """The UTF-8 words of a finite, small language (None: not finite, or too many words)."""
    kind = node[0]
    if kind == "set":
        out = []
        for lo, hi in node[1]:
            if hi - lo >= _MAX_WORDS or len(out) > _MAX_WORDS:
                return None
            out += [chr(c).encode() for c in range(lo, hi + 1) if not 0xD800 <= c <= 0xDFFF]
        return out if 0 < len(out) <= _MAX_WORDS else None
    if kind == "cat":
        acc = [b""]
        for sub in node[1]:
            w = _words(sub)
            if w is None or len(acc) * len(w) > _MAX_WORDS:
                return None
            acc = [a + b for a in acc for b in w]
        return acc
    if kind == "alt":
        out = []
        for sub in node[1]:
            w = _words(sub)
            if w is None:
                return None
            out += w
            if len(out) > _MAX_WORDS:
                return None
        return out
    return None


def _words_dfa(words: list[bytes], pattern: str) -> ByteDFA | None:
    """The minimal DFA of a finite language, numbered as ``finish`` numbers DFAs (breadth-first in byte
    order from the start); None past ``MAX_DFA_STATES`` trie states.

    Up to ``MINIMISE_LIMIT`` states this is exactly ``finish``'s DFA from the subset construction
    (the trie has at least as many states as the subset DFA, whose states are the sets of NFA
    positions reached by the same prefixes, so ``finish`` minimises that one too, and minimal DFAs
    numbered this way are equal). Beyond it ``finish`` would leave the DFA unminimised: same language,
    more states, and slowly (a big enum of codes); here fewer states, sooner. What a lexer does
    depends only on the language."""
    children: list[dict[int, int]] = [{}]
    accept = [False]
    for w in words:
        s = 0
        for b in w:
            nxt = children[s].get(b)
            if nxt is None:
                nxt = children[s][b] = len(children)
                children.append({})
                accept.append(False)
                if len(children) > MAX_DFA_STATES:
                    return None
            s = nxt
        accept[s] = True
    if not any(accept):
        return None
    # Minimise bottom-up (a child is numbered after its parent): equal signatures, equal states.
    n = len(children)
    label = [0] * n
    sigs: dict = {}
    for s in range(n - 1, -1, -1):
        sig = (accept[s], tuple(sorted((b, label[t]) for b, t in children[s].items())))
        label[s] = sigs.setdefault(sig, len(sigs))
    rows: dict[int, list[tuple[int, int]]] = {}
    acc: dict[int, bool] = {}
    for s in range(n):
        if label[s] not in rows:
            rows[label[s]] = sorted((b, label[t]) for b, t in children[s].items())
            acc[label[s]] = accept[s]
    order = [label[0]]
    ids = {label[0]: 0}
    k = 0
    while k < len(order):
        for _, t in rows[order[k]]:
            if t not in ids:
                ids[t] = len(order)
                order.append(t)
        k += 1
    trans = np.full((len(order), 256), -1, dtype=np.int32)
    for i, lab in enumerate(order):
        for b, t in rows[lab]:
            trans[i, b] = ids[t]
    return ByteDFA(trans, np.array([acc[lab] for lab in order], dtype=bool), pattern)


@functools.lru_cache(maxsize=512)
def compile_regex(pattern: str, where: str = "regex") -> ByteDFA:
    """The byte DFA of a Python regex (cached: equal patterns share one DFA object). Terminals are kept
    by the lexer space (``dfa_store.DFAStore``), so this cache stays small: each DFA object it holds is one
    more object for every full collection of the garbage collector."""
    dfa = compile_node(parse(pattern, where), pattern)
    if dfa.accept[0]:
        raise GrammarError(f"{where}: terminal {pattern!r} matches the empty string")
    return dfa


__all__ = ["ByteDFA", "compile_node", "compile_regex", "negate", "product", "utf8_sequences"]
