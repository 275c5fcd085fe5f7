"""Lint a Lark grammar for constrained decoding.

``build_tables`` already refuses what cannot work at all (syntax errors, shift/reduce and
reduce/reduce conflicts, unsupported regex syntax, rules with no finite expansion, too many LALR
states). ``lint_grammar`` adds what builds but would misbehave:

- two terminals that can match the same text in the same parser state, with equal priority, where
  Lark has no rule to decide (a string literal against a regex is fine: Lark's "unless" keeps the
  literal, and so do we);
- a terminal that Lark tries first and that accepts a proper prefix of what another terminal in the
  same state could still match: Lark's lexer (leftmost-first) would stop there, our greedy byte lexer
  would not, so the two could disagree;
- an ``%ignore`` terminal with an unbounded match (``/\\s+/``): small models loop on whitespace.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from itertools import combinations

from .compiler import read_grammar
from .counted import CountedDFA
from .dfa import ByteDFA
from .lalr_tables import Terminal, build_tables
from .lexer_space import SPACE
from .regex import has_right_context


def _plain(d: int) -> ByteDFA:
    """The plain DFA of terminal DFA ``d`` (a counted one is walked state by state here)."""
    dfa = SPACE.dfas[d]
    return dfa.plain() if isinstance(dfa, CountedDFA) else dfa


def _line(text: str, name: str) -> int:
    m = re.search(rf"^\s*{re.escape(name)}\s*(\.\s*-?\d+\s*)?:", text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else 0


def _lark_order(t: Terminal) -> tuple:
    return (-t.priority, -t.max_width, -t.value_len, t.name)


def _product_search(a: ByteDFA, b: ByteDFA, goal) -> bytes | None:
    """Breadth-first over pairs of states reached by the same bytes; the shortest string whose pair
    satisfies ``goal(x, y)`` (the start pair excluded), or None."""
    start = (0, 0)
    prev: dict = {start: None}
    q = deque([start])
    while q:
        x, y = q.popleft()
        if (x, y) != start and goal(x, y):
            out = bytearray()
            node = (x, y)
            while prev[node] is not None:
                node, byte = prev[node]
                out.append(byte)
            return bytes(reversed(out))
        ra, rb = a.rows[x], b.rows[y]
        for byte in range(256):
            nx, ny = ra[byte], rb[byte]
            if nx >= 0 and ny >= 0 and (nx, ny) not in prev:
                prev[(nx, ny)] = ((x, y), byte)
                q.append((nx, ny))
    return None


def _overlap(a: ByteDFA, b: ByteDFA) -> bytes | None:
    """A shortest non-empty string both DFAs accept, or None."""
    return _product_search(a, b, lambda x, y: a.accept[x] and b.accept[y])


def _prefix_conflict(first: ByteDFA, second: ByteDFA) -> bytes | None:
    """A string ``first`` accepts after which ``second`` could still go on, or None."""
    return _product_search(
        first, second, lambda x, y: first.accept[x] and any(t >= 0 for t in second.rows[y])
    )


def _unbounded(d: ByteDFA) -> bool:
    """Whether the DFA has a cycle (accepts arbitrarily long strings)."""
    color = [0] * d.n_states
    stack = [(0, iter(set(d.rows[0])))]
    color[0] = 1
    while stack:
        s, it = stack[-1]
        for t in it:
            if t < 0:
                continue
            if color[t] == 1:
                return True
            if color[t] == 0:
                color[t] = 1
                stack.append((t, iter(set(d.rows[t]))))
                break
        else:
            color[s] = 2
            stack.pop()
    return False


def lint_grammar(source, *, start: str = "start", max_states: int = 2000) -> list[str]:
    """Problems of a grammar (text, path or name in ``grammars/``); ``[]`` when clean.

    Raises GrammarError when the grammar does not build at all (strict LALR, bounded states)."""
    text, name = read_grammar(source)
    tables = build_tables(text, name, start, max_states=max_states)
    terms = tables.terminals
    # one DFA object per terminal for this call: the lexer space rebuilds a view per request, and the
    # pair checks read each one's rows (built on first use) many times
    plain = functools.cache(_plain)
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for acts in tables.actions:
        ctx = sorted({n for n in acts if n in terms} | set(tables.ignore))
        for a, b in combinations(ctx, 2):
            if (a, b) in seen:
                continue
            seen.add((a, b))
            ta, tb = terms[a], terms[b]
            da, db = plain(ta.dfa), plain(tb.dfa)
            if ta.priority == tb.priority and ta.is_str == tb.is_str:
                both = _overlap(da, db)
                if both is not None:
                    problems.append(
                        f"{name}:{_line(text, a)}: terminals {a} and {b} both match {both!r} "
                        "in the same parser state (give one a priority)"
                    )
                    continue
            first, second = sorted((ta, tb), key=_lark_order)
            if second.literal is not None and plain(first.dfa).matches(second.literal.encode()):
                continue  # Lark's "unless": the literal wins on an exact match, as in our lexer
            p = _prefix_conflict(plain(first.dfa), plain(second.dfa))
            if p is not None:
                problems.append(
                    f"{name}:{_line(text, first.name)}: terminal {first.name} matches {p!r}, which "
                    f"{second.name} could extend; Lark stops there, a greedy lexer would not"
                )
    for t in terms.values():
        if has_right_context(t.pattern):
            problems.append(
                f"{name}:{_line(text, t.name)}: terminal {t.name} ends with a look-ahead; the "
                "byte lexer does not enforce right context"
            )
    for ig in tables.ignore:
        if _unbounded(plain(terms[ig].dfa)):
            problems.append(
                f"{name}:{_line(text, ig)}: %ignore {ig} matches unbounded runs; bound it "
                "(e.g. /[ \\t]|\\r?\\n[ \\t]{0,20}/)"
            )
    return problems
