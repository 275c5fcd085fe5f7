"""Small code-point automata that we turn back into regex text (state elimination).

Some languages are easiest to build as automata and must still be written into a Lark grammar as
Python regexes: numbers within bounds (a digit-by-digit comparison automaton). ``to_ast`` converts
such an automaton, given as labelled edges over code-point ranges, into a regex AST (``regex.py``).
"""

from __future__ import annotations

from collections import defaultdict

from ..regex import EMPTY, Node, alt, cat, norm, rep

_NONE = None  # "no path" in the elimination table


class CodepointDFA:
    """States 0..n-1, ``start``; ``edges[(p, q)]`` = code-point ranges; ``accept`` a set of states."""

    def __init__(self) -> None:
        self.n = 0
        self.start = 0
        self.accept: set[int] = set()
        self.edges: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)

    def state(self) -> int:
        self.n += 1
        return self.n - 1

    def add(self, p: int, q: int, ranges) -> None:
        self.edges[(p, q)].extend(ranges)

    def to_ast(self) -> Node:
        """A regex AST for the automaton's language (no empty-language support: raises if empty)."""
        return _eliminate(self)


def _union(a: Node | None, b: Node | None) -> Node | None:
    if a is None:
        return b
    if b is None:
        return a
    if a == b:
        return a
    if a[0] == "set" and b[0] == "set":
        return ("set", norm(a[1] + b[1]))
    items = list(a[1]) if a[0] == "alt" else [a]
    for x in b[1] if b[0] == "alt" else [b]:
        if x not in items:
            items.append(x)
    return alt(*items)


def _concat(*parts: Node | None) -> Node | None:
    if any(p is None for p in parts):
        return None
    return cat(*parts)


def _eliminate(d: CodepointDFA) -> Node:
    # Generalised NFA: extra start S and final F with epsilon edges.
    S, F = d.n, d.n + 1
    R: dict[int, dict[int, Node]] = defaultdict(dict)
    for (p, q), ranges in d.edges.items():
        node: Node = ("set", norm(ranges))
        R[p][q] = _union(R[p].get(q), node)
    R[S][d.start] = EMPTY
    for a in d.accept:
        R[a][F] = _union(R[a].get(F), EMPTY)
    remaining = set(range(d.n))
    while remaining:
        # Eliminate the state with the fewest in*out edges first (keeps expressions small).
        def cost(s: int) -> int:
            ins = sum(1 for p in R if s in R[p] and p != s)
            outs = sum(1 for q in R[s] if q != s)
            return ins * outs

        s = min(remaining, key=cost)
        remaining.discard(s)
        loop = R[s].get(s)
        star = rep(loop, 0, None) if loop is not None else EMPTY
        outs = {q: r for q, r in R[s].items() if q != s}
        ins = [p for p in list(R) if s in R[p] and p != s]
        for p in ins:
            rin = R[p].pop(s)
            for q, rout in outs.items():
                R[p][q] = _union(R[p].get(q), _concat(rin, star, rout))
        R.pop(s, None)
        for p in R:
            R[p].pop(s, None)
    result = R[S].get(F)
    if result is None:
        raise ValueError("automaton accepts nothing")
    return result
