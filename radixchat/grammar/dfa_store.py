"""Containers that Python's garbage collector neither tracks nor walks, for the process-wide caches.

Every container object is one more thing each full collection visits, and the lexer space and the run
caches keep one entry per lexer state (tens of thousands over a long run). So the terminal DFAs are kept
as their arrays (``DFAStore``), and the values of long-lived caches are boxed in numpy object arrays
(``untracked``).
"""

from __future__ import annotations

import numpy as np

from .counted import CountedDFA
from .dfa import ByteDFA


class DFAStore:
    """The terminal DFAs of the lexer space, by id. A plain DFA is kept as its arrays (transitions,
    accepting states, distances, pattern) in numpy object arrays, which the garbage collector neither
    tracks nor walks; ``store[d]`` rebuilds a ``ByteDFA`` over them. A ByteDFA object per DFA was the
    largest thing left in each full collection once many schemas had been compiled.
    Counted DFAs (a few per grammar) are kept as objects. The hot paths read the columns directly."""

    __slots__ = ("trans", "accept", "dist", "pattern", "plain", "_counted", "_n")

    def __init__(self) -> None:
        self._n = 0
        # per DFA: its transitions (n_states x 256 ints; counted: rows by state), accepting states, distances
        self.trans = np.empty(64, dtype=object)
        self.accept = np.empty(64, dtype=object)
        self.dist = np.empty(64, dtype=object)
        self.pattern = np.empty(64, dtype=object)
        self.plain = np.zeros(64, dtype=bool)  # a ByteDFA (else counted)
        self._counted: dict[int, CountedDFA] = {}

    def append(self, dfa: ByteDFA | CountedDFA) -> int:
        d = self._n
        if d == self.plain.shape[0]:
            for name in ("trans", "accept", "dist", "pattern", "plain"):
                old = getattr(self, name)
                new = np.zeros(2 * d, dtype=bool) if name == "plain" else np.empty(2 * d, dtype=object)
                new[:d] = old
                setattr(self, name, new)
        self.trans[d] = dfa.trans
        self.accept[d] = dfa.accept
        self.dist[d] = dfa.dist
        self.pattern[d] = dfa.pattern
        if isinstance(dfa, ByteDFA):
            self.plain[d] = True
        else:
            self._counted[d] = dfa
        self._n = d + 1
        return d

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, d: int) -> ByteDFA | CountedDFA:
        if d >= self._n or d < 0:
            raise IndexError(d)
        got = self._counted.get(d)
        if got is not None:
            return got
        return ByteDFA.of(self.trans[d], self.accept[d], self.dist[d], self.pattern[d])


def untracked(*values) -> np.ndarray:
    """``values`` in a numpy object array: a container the garbage collector neither tracks nor walks.

    For the values of long-lived caches: a dict whose keys and values are all untracked is itself
    untracked, but one new tuple value (tuples start out tracked) makes it tracked again, and a full
    collection then walks every entry (a long run's caches of runs were most of what it visited).
    Only for values that cannot lead back to the box (no cycle
    through it can exist, so the collector missing it frees nothing late)."""
    box = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        box[i] = v
    return box
