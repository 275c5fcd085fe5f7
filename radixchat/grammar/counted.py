"""Counted repetitions: a terminal ``pre · X{lo,hi} · suf`` as a small skeleton DFA plus a counter.

A plain DFA of ``X{lo,hi}`` has one copy of X's states per count: a JSON string with ``maxLength``
10,000 would be tens of thousands of states, each a new lexer state whose token run costs a pass over
the vocabulary. ``CountedDFA`` keeps the skeleton ``pre · X* · suf`` (a few states) and a counter ``c``
(items of X begun so far): its states are pairs ``(skeleton state, c)``, numbered arithmetically and
built (their rows) only when reached, so a terminal costs what its skeleton costs whatever its bounds. Where the counter lives, the
token runs are derived from one run of the skeleton per tokenizer (``counted_runs``).

It is used only where the skeleton reads every string of the language in exactly one way (checked
when it is built, else the plain DFA is compiled): ``pre`` is not nullable and no string of it is a
proper prefix of another (its accepting states have no moves), likewise X, ``suf`` is not nullable,
and the first bytes of X and of ``suf`` are disjoint. Then at the loop's head ``H`` a byte either
begins an item (allowed while ``c < hi``; ``c += 1``) or leaves the loop (allowed when ``c >= lo``),
and only ``suf`` states accept. An item counts when it begins: an escape (``\\n``, ``\\uXXXX``, a
surrogate pair) or a multi-byte character is one item, as in the plain DFA of ``X{lo,hi}``. Without
``hi`` the count stops at ``lo``.

The states satisfy ``ByteDFA``'s contracts (state 0 starts and is never re-entered; every state can
still accept, since ``lo <= hi``) through the same members: ``trans[s]``, ``rows[s]``, ``accept[s]``,
``dist[s]``, computed on demand.
"""

from __future__ import annotations

import functools

import numpy as np

from .dfa import ByteDFA, compile_node, compile_regex
from .errors import GrammarError
from .regex import Node, parse, to_regex

#: A repetition is counted when its upper bound (or, if unbounded, its lower bound) is at least this.
MIN_COUNT = 2


class _NotCountable(Exception):
    """The terminal does not have the shape a counter needs; compile the plain DFA."""


class Loop:
    """The tail ``X* · suf`` shared by counted terminals with the same X and ``suf``.

    Local states: 0 is the head H, then X's interior states (``< n_loop``: the loop, where the count
    matters), then ``suf``'s states. ``ann[l, b]`` is 1 where the move begins an item of X, 2 where it
    leaves the loop, else 0."""

    __slots__ = ("key", "trans", "ann", "accept", "n_loop", "base_dist", "min_item", "exit_dist", "moves")

    def __init__(self, key: tuple[str, str], x: ByteDFA, suf: ByteDFA) -> None:
        if x.accept[0] or suf.accept[0]:
            raise _NotCountable("nullable item or suffix")
        acc = np.flatnonzero(x.accept)
        if (x.trans[acc] >= 0).any():
            raise _NotCountable("an item can go on after it is complete")
        inner = [s for s in range(1, x.n_states) if not x.accept[s]]
        n_loop = 1 + len(inner)
        m = n_loop + suf.n_states - 1
        xmap = np.zeros(x.n_states, dtype=np.int32)  # accepting item states are the head again
        xmap[inner] = np.arange(1, n_loop, dtype=np.int32)
        smap = np.arange(n_loop - 1, m, dtype=np.int32)  # suf state u >= 1 -> n_loop + u - 1
        trans = np.full((m, 256), -1, dtype=np.int32)
        ann = np.zeros((m, 256), dtype=np.int8)
        xt, st = x.trans[0], suf.trans[0]
        if ((xt >= 0) & (st >= 0)).any():
            raise _NotCountable("an item and the suffix begin with the same byte")
        trans[0, xt >= 0] = xmap[xt[xt >= 0]]
        ann[0, xt >= 0] = 1
        trans[0, st >= 0] = smap[st[st >= 0]]
        ann[0, st >= 0] = 2
        for s in inner:
            row = x.trans[s]
            trans[xmap[s], row >= 0] = xmap[row[row >= 0]]
        for u in range(1, suf.n_states):
            row = suf.trans[u]
            trans[smap[u], row >= 0] = smap[row[row >= 0]]
        accept = np.zeros(m, dtype=bool)
        accept[n_loop:] = suf.accept[1:]
        base = np.zeros(m, dtype=np.int64)
        base[1:n_loop] = x.dist[inner]
        base[n_loop:] = suf.dist[1:]
        self.key = key
        self.trans, self.ann, self.accept, self.n_loop = trans, ann, accept, n_loop
        self.base_dist = base  # loop: bytes to finish the current item; suf: bytes to acceptance
        self.min_item = int(x.dist[0])
        self.exit_dist = int(suf.dist[0])
        # Per state: its distinct moves (target, annotation), the live bytes, and each one's move.
        self.moves = []
        for local in range(m):
            live = trans[local] >= 0
            codes = trans[local][live].astype(np.int64) * 4 + ann[local][live]
            uniq, inv = np.unique(codes, return_inverse=True)
            self.moves.append(([divmod(c, 4) for c in uniq.tolist()], live, inv.reshape(-1)))


@functools.lru_cache(maxsize=256)
def _loop(x_re: str, suf_re: str) -> Loop:
    return Loop((x_re, suf_re), compile_node(parse(x_re), x_re), compile_node(parse(suf_re), suf_re))


class _Lazy:
    __slots__ = ("get",)

    def __init__(self, get) -> None:
        self.get = get

    def __getitem__(self, s):
        return self.get(int(s))


class CountedDFA:
    """``pre · X{lo,hi} · suf`` over skeleton states and a count (see the module docstring).

    Global skeleton states: ``pre``'s (below ``base``; its accepting states are the head instead),
    then the loop's local states from ``base`` on. A state is ``(g, c)``; ``c`` is 0 outside the loop.
    Its number is ``g + width * c`` (arithmetic: no table of states grows with the text)."""

    __slots__ = (
        "pattern",
        "pre",
        "loop",
        "lo",
        "hi",
        "base",
        "width",
        "_rows",
        "trans",
        "rows",
        "accept",
        "dist",
    )

    def __init__(self, pattern: str, pre: ByteDFA | None, loop: Loop, lo: int, hi: int | None) -> None:
        self.pattern, self.pre, self.loop, self.lo, self.hi = pattern, pre, loop, lo, hi
        self.base = pre.n_states if pre is not None else 0
        self.width = self.base + loop.trans.shape[0]
        self._rows: dict[int, np.ndarray] = {}
        self.trans = _Lazy(self.row)
        self.rows = _Lazy(lambda s: self.row(s).tolist())
        self.accept = _Lazy(self._accepts)
        self.dist = _Lazy(self._dist)

    # -- states ------------------------------------------------------------------------------------

    def state_id(self, st: tuple[int, int]) -> int:
        return st[0] + self.width * st[1]

    def state(self, s: int) -> tuple[int, int]:
        c, g = divmod(s, self.width)
        return g, c

    def state_key(self, s: int) -> list[int]:
        """A process-independent name of state ``s`` (ids are numbered in the order states are met)."""
        return list(self.state(s))

    def state_of(self, key) -> int:
        g, c = key
        return self.state_id((int(g), int(c)))

    def after(self, local: int, c: int, items: int) -> tuple[int, int]:
        """The state at loop-local state ``local`` after ``items`` more items from count ``c``."""
        if local >= self.loop.n_loop:
            return self.base + local, 0
        c += items
        return self.base + local, (c if self.hi is not None else min(c, self.lo))

    @property
    def n_states(self) -> int:
        """States whose rows were built so far (those the lexer stepped from): never the bound times
        the item's states."""
        return len(self._rows)

    def row(self, s: int) -> np.ndarray:
        """Next state for each byte (-1: dead), int32[256]."""
        r = self._rows.get(s)
        if r is not None:
            return r
        g, c = self.state(s)
        out = np.full(256, -1, dtype=np.int32)
        if g < self.base:
            pt = self.pre.trans[g]
            for t in np.unique(pt[pt >= 0]).tolist():
                nxt = self.base if self.pre.accept[t] else t
                out[pt == t] = self.state_id((nxt, 0))
        else:
            lp = self.loop
            local = g - self.base
            moves, live, inv = lp.moves[local]
            tgt = np.full(len(moves), -1, dtype=np.int32)
            for k, (t, a) in enumerate(moves):
                if a == 1:  # begins an item
                    if self.hi is not None and c >= self.hi:
                        continue
                    tgt[k] = self.state_id(self.after(t, c, 1))
                elif a == 2:  # leaves the loop
                    if c >= self.lo:
                        tgt[k] = self.state_id((self.base + t, 0))
                else:
                    tgt[k] = self.state_id(self.after(t, c, 0))
            out[live] = tgt[inv]
        self._rows[s] = out
        return out

    def _accepts(self, s: int) -> bool:
        g, _ = self.state(s)
        return g >= self.base and bool(self.loop.accept[g - self.base])

    def _dist(self, s: int) -> int:
        g, c = self.state(s)
        lp = self.loop
        if g < self.base:
            return int(self.pre.dist[g]) + self.lo * lp.min_item + lp.exit_dist
        local = g - self.base
        if local >= lp.n_loop:
            return int(lp.base_dist[local])
        return int(lp.base_dist[local]) + max(0, self.lo - c) * lp.min_item + lp.exit_dist

    def in_loop(self, s: int) -> int:
        """The loop-local state of ``s`` if it is in the loop (where the count matters), else -1."""
        g, _ = self.state(s)
        local = g - self.base
        return local if 0 <= local < self.loop.n_loop else -1

    # -- ByteDFA's queries -------------------------------------------------------------------------

    def matches(self, data: bytes) -> bool:
        s = 0
        for b in data:
            s = int(self.row(s)[b])
            if s < 0:
                return False
        return self._accepts(s)

    def is_empty(self) -> bool:
        return False

    def shortest(self) -> int:
        return self._dist(0)

    def example(self) -> bytes:
        out = bytearray()
        s = 0
        while not self._accepts(s):
            row = self.row(s)
            d = self._dist(s)
            b = next(b for b in range(256) if row[b] >= 0 and self._dist(int(row[b])) == d - 1)
            out.append(b)
            s = int(row[b])
        return bytes(out)

    def plain(self) -> ByteDFA:
        """The plain DFA of the same pattern (for tools that walk every state, e.g. ``lint``)."""
        return compile_regex(self.pattern)


def _split(node: Node) -> tuple[Node | None, Node, int, int | None, Node] | None:
    """``(pre, X, lo, hi, suf)`` of a concatenation around its widest counted repetition, or None."""
    if node[0] != "cat":
        return None
    items = node[1]
    best, width = -1, 0
    for i, it in enumerate(items):
        if it[0] == "look":
            return None
        if it[0] == "rep":
            _, _, lo, hi = it
            w = hi if hi is not None else (lo if lo >= MIN_COUNT else 0)
            if w >= MIN_COUNT and w > width:
                best, width = i, w
    if best < 0 or best == len(items) - 1:
        return None
    _, x, lo, hi = items[best]
    pre = ("cat", items[:best]) if best else None
    return pre, x, lo, hi, ("cat", items[best + 1 :])


def _counted(pattern: str, node: Node) -> CountedDFA:
    parts = _split(node)
    if parts is None:
        raise _NotCountable("no counted repetition")
    pre_node, x, lo, hi, suf = parts
    if hi is not None and hi < lo:
        raise _NotCountable("empty repetition")
    pre = None
    if pre_node is not None:
        pre_re = to_regex(pre_node)
        pre = compile_node(parse(pre_re), pre_re)
        acc = np.flatnonzero(pre.accept)
        if pre.accept[0] or (pre.trans[acc] >= 0).any():
            raise _NotCountable("the prefix is nullable or not prefix-free")
    return CountedDFA(pattern, pre, _loop(to_regex(x), to_regex(suf)), lo, hi)


def compile_terminal(pattern: str, where: str = "regex") -> ByteDFA | CountedDFA:
    """The DFA of a terminal's regex: counted (``CountedDFA``) where its shape allows, else plain. Not
    cached here: the lexer space keeps each pattern's DFA (``LexerSpace.dfa_id``), as arrays the garbage
    collector does not walk; a cache of DFA objects would keep thousands of them in its care."""
    try:
        return _counted(pattern, parse(pattern, where))
    except (_NotCountable, GrammarError):
        return compile_regex(pattern, where)


__all__ = ["MIN_COUNT", "CountedDFA", "Loop", "compile_terminal"]
