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
from collections import deque

import numpy as np

from .errors import GrammarError
from .limits import check
from .regex import MAX_CP, Node, negate, parse

_LEN_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CP))
MAX_DFA_STATES = 50_000


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
        for lo, hi in ranges:
            for seq in utf8_sequences(lo, hi):
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


class ByteDFA:
    """A trimmed byte DFA (see the module docstring for its contracts)."""

    __slots__ = ("trans", "accept", "dist", "rows", "pattern")

    def __init__(self, trans: np.ndarray, accept: np.ndarray, pattern: str = "") -> None:
        self.trans = trans
        self.accept = accept
        self.pattern = pattern
        self.dist = _distances(trans, accept)
        # Rows as int arrays, not lists of ints: the garbage collector does not walk them (lists of the
        # process's DFAs held millions of int references, and every full collection visited them all).
        t32 = np.ascontiguousarray(trans, dtype=np.int32)
        self.rows: list[array] = [array("i", r.tobytes()) for r in t32]

    @property
    def n_states(self) -> int:
        return int(self.trans.shape[0])

    def matches(self, data: bytes) -> bool:
        s = 0
        for b in data:
            s = self.rows[s][b]
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


def _distances(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    n = trans.shape[0]
    dist = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return dist
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
    if n <= 400:  # Moore refinement is quadratic-ish; large DFAs from counted repeats are near-minimal
        labels, rep, _ = _minimise(t, accept, live)
        t = np.where(t[rep] >= 0, labels[np.clip(t[rep], 0, None)], -1)
        accept = accept[rep]
        start = int(labels[0])
    else:
        start = 0
    # Renumber reachable states from start, BFS order; split the start state if re-entered.
    rows = t.tolist()
    reentered = any(start in r for r in rows)
    order = [start]
    ids = {("s", start): 0} if reentered else {start: 0}
    new_rows: list[list[int]] = []
    acc: list[bool] = []
    k = 0
    while k < len(order):
        s = order[k]
        row = []
        for nxt in rows[s]:
            if nxt < 0:
                row.append(-1)
                continue
            j = ids.get(nxt)
            if j is None:
                j = ids[nxt] = len(order)
                order.append(nxt)
            row.append(j)
        new_rows.append(row)
        acc.append(bool(accept[s]))
        k += 1
    return ByteDFA(np.array(new_rows, dtype=np.int32).reshape(-1, 256), np.array(acc, dtype=bool), pattern)


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
    """Intersection (``mode="and"``) or difference (``"minus"``) of two DFAs' languages."""
    # For "minus", b is completed with a dead sink (-1 stays -1 and means "b rejects").
    ids = {(0, 0): 0}
    order = [(0, 0)]
    rows: list[list[int]] = []
    acc: list[bool] = []
    ar, br = a.rows, b.rows
    k = 0
    while k < len(order):
        sa, sb = order[k]
        k += 1
        row = []
        for byte in range(256):
            na = ar[sa][byte]
            nb = br[sb][byte] if sb >= 0 else -1
            if na < 0 or (mode == "and" and nb < 0):
                row.append(-1)
                continue
            key = (na, nb)
            j = ids.get(key)
            if j is None:
                j = ids[key] = len(order)
                order.append(key)
                if len(order) > MAX_DFA_STATES:
                    raise GrammarError(f"terminal {pattern!r} too large")
                if not len(order) & 255:
                    check()
            row.append(j)
        rows.append(row)
        if mode == "and":
            acc.append(bool(a.accept[sa]) and sb >= 0 and bool(b.accept[sb]))
        else:
            acc.append(bool(a.accept[sa]) and not (sb >= 0 and b.accept[sb]))
    return finish(np.array(rows, dtype=np.int64).reshape(-1, 256), np.array(acc, dtype=bool), pattern)


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
    nfa = _NFA()
    s, e = nfa.build(body)
    dfa = finish(*_subset(nfa, s, e), pattern)
    for positive, sub in looks:
        nfa2 = _NFA()
        s2, e2 = nfa2.build(sub)
        other = _prefix_closed(finish(*_subset(nfa2, s2, e2), pattern))
        dfa = product(dfa, other, "and" if positive else "minus", pattern)
    return dfa


@functools.lru_cache(maxsize=4096)
def compile_regex(pattern: str, where: str = "regex") -> ByteDFA:
    """The byte DFA of a Python regex (cached: equal patterns share one DFA object)."""
    dfa = compile_node(parse(pattern, where), pattern)
    if dfa.accept[0]:
        raise GrammarError(f"{where}: terminal {pattern!r} matches the empty string")
    return dfa


__all__ = ["ByteDFA", "compile_node", "compile_regex", "negate", "product", "utf8_sequences"]
