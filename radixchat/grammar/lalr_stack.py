"""The LALR(1) parser's run time: pure functions over parser stacks, and a cache keyed by stack tops.

Stacks are tuples of LALR state numbers of one grammar's ``Tables`` (``lalr_tables``). Every function
that looks at a stack also reports ``lowest``, the lowest stack index whose value it read, so that
results can be cached under the top of the stack only (``DepthMemo``). Where the grammar keeps
conflicts (``Tables.forks``), the ``*_all``/forked variants follow every action at once.
"""

from __future__ import annotations

from .errors import GrammarError
from .lalr_tables import END, INF, ROOT, Tables


def push(tables: Tables, stack: tuple[int, ...], term: str) -> tuple[tuple[int, ...] | None, int]:
    """Feed one terminal: reductions, then the shift. Returns (new stack or None on error, lowest).

    What the terminal does above each top the stack reaches is kept (``_push_above``), so a chain of a
    hundred reductions is a few lookups; the stack tuple is built once, at the shift."""
    gotos = tables.gotos
    lowest = c = len(stack) - 1
    top = stack[-1]  # the stack is ``stack[:c] + (top,)`` (see ``shiftable``)
    while True:
        got = _push_above(tables, top, term)
        if got is None:
            return None, lowest
        pops, what, above = got
        if not pops:  # shifted: ``above`` is what the reductions left on top, then the shifted state
            return stack[:c] + (top,) + above, lowest
        c -= pops - 1
        if c - 1 < lowest:
            lowest = c - 1
        top = gotos[stack[c - 1]][what]


def _push_above(tables: Tables, q: int, term: str) -> tuple[int, object, tuple[int, ...]] | None:
    """``push`` of one terminal from a stack whose top is ``q``, as far as it stays above ``q``: None
    (an error), ``(0, None, states pushed above q)`` (shifted), or ``(entries popped, counting q; the
    rule's origin; ())`` for the reduction that pops ``q``. Kept per ``(q, term)``, like
    ``_reduce_above``."""
    key = (q, term)
    got = tables.pushes.get(key, False)
    if got is not False:
        return got
    actions, gotos, rules = tables.actions, tables.gotos, tables.rules
    loc: list[int] = [q]
    while True:
        act = actions[loc[-1]].get(term)
        if act is None:
            got = None
            break
        if act[0]:
            got = (0, None, (*loc[1:], act[1]))
            break
        origin, n = rules[act[1]]
        if n >= len(loc):
            got = (n - len(loc) + 1, origin, ())
            break
        if n:
            del loc[len(loc) - n :]
        loc.append(gotos[loc[-1]][origin])
    tables.pushes[key] = got
    return got


MAX_FORKS = 64  # parses followed at once (a guard against explosive ambiguity: each costs a mask)


def push_all(tables: Tables, stack: tuple[int, ...], term: str) -> tuple[list[tuple[int, ...]], int]:
    """``push`` following every action where the grammar has conflicts: the new stacks (none on error,
    several where the parse forks) and the lowest index read."""
    if not tables.forks:
        st, low = push(tables, stack, term)
        return ([st] if st is not None else []), low
    actions, gotos, rules, forks = tables.actions, tables.gotos, tables.rules, tables.forks
    lowest = len(stack) - 1
    out: dict[tuple[int, ...], None] = {}
    todo = [stack]
    seen = {stack}
    while todo:
        st = todo.pop()
        top = st[-1]
        act = actions[top].get(term)
        if act is None:
            continue
        for is_shift, arg in forks.get((top, term), (act,)):
            if is_shift:
                out[st + (arg,)] = None
                continue
            origin, n = rules[arg]
            below = st[:-n] if n else st
            if len(below) - 1 < lowest:
                lowest = len(below) - 1
            nxt = below + (gotos[below[-1]][origin],)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
                if len(seen) > MAX_FORKS:
                    raise GrammarError(f"the grammar is too ambiguous here (over {MAX_FORKS} parses)")
    return list(out), max(lowest, 0)


def shiftable(tables: Tables, stack: tuple[int, ...], terms) -> tuple[list[str], int]:
    """The terminals of ``terms`` that ``push_all`` would shift from ``stack`` (after its reductions),
    and the lowest index read: the same answer as ``push_all`` per terminal, but terminals that take the
    same reduction share it (a state with a hundred lookaheads reduces once, not a hundred times)."""
    if tables.forks:
        return _shiftable_forked(tables, stack, terms)
    gotos, bit = tables.gotos, tables.bits
    lowest = len(stack) - 1
    want = 0
    for term in terms:
        want |= bit[term]
    shifted = 0
    # The stack while reducing is ``stack[:c] + (top,)``; what ``top`` does with a set of terminals
    # before it must pop itself is the same on any stack (``_reduce_above``, kept per state and set).
    todo = [(len(stack) - 1, stack[-1], want)]
    while todo:
        c, top, ts = todo.pop()
        got, escapes = _reduce_above(tables, top, ts)
        shifted |= got
        for pops, origin, group in escapes:  # pops ``top`` and ``pops - 1`` entries below it
            c2 = c - pops + 1
            if c2 - 1 < lowest:
                lowest = c2 - 1
            todo.append((c2, gotos[stack[c2 - 1]][origin], group))
    return [term for term in terms if bit[term] & shifted], max(lowest, 0)


def _reduce_above(tables: Tables, q: int, ts: int) -> tuple[int, tuple[tuple[int, str, int], ...]]:
    """From a stack whose top is ``q``, with the terminals of bit set ``ts``: the terminals shifted
    after reductions that stay above ``q``, and ``[(entries popped, counting q; the rule's origin;
    terminals)]`` for the reductions that pop ``q`` itself. Independent of the stack below ``q``, so
    kept per ``(q, ts)``: the long chains of an object of many optional properties run once per state,
    not once per stack."""
    key = (q, ts)
    got = tables.reductions.get(key)
    if got is not None:
        return got
    gotos, rules, by_bits = tables.gotos, tables.rules, tables.actions_by_bits
    shifted = 0
    escapes: list[tuple[int, str, int]] = []
    todo: list[tuple[tuple[int, ...], int]] = [((q,), ts)]  # the stack above (and with) q, and terminals
    while todo:
        loc, ts = todo.pop()
        for is_shift, arg, bits in by_bits(loc[-1]):
            group = ts & bits
            if not group:
                continue
            if is_shift:
                shifted |= group
                continue
            origin, n = rules[arg]
            if n < len(loc):
                rest = loc[: len(loc) - n]
                todo.append((rest + (gotos[rest[-1]][origin],), group))
            else:
                escapes.append((n - len(loc) + 1, origin, group))
    got = tables.reductions[key] = (shifted, tuple(escapes))
    return got


def _shiftable_forked(tables: Tables, stack: tuple[int, ...], terms) -> tuple[list[str], int]:
    actions, gotos, rules, forks = tables.actions, tables.gotos, tables.rules, tables.forks
    lowest = len(stack) - 1
    out: dict[str, None] = {}
    todo = [(stack, list(terms))]
    seen: dict[tuple[int, ...], set] = {stack: set(terms)}
    while todo:
        st, ts = todo.pop()
        top = st[-1]
        acts = actions[top]
        groups: dict[int, list[str]] = {}
        for term in ts:
            act = acts.get(term)
            if act is None:
                continue
            for is_shift, arg in forks.get((top, term), (act,)):
                if is_shift:
                    out[term] = None
                else:
                    g = groups.get(arg)
                    if g is None:
                        groups[arg] = [term]
                    else:
                        g.append(term)
        for rule, group in groups.items():
            origin, n = rules[rule]
            below = st[:-n] if n else st
            if len(below) - 1 < lowest:
                lowest = len(below) - 1
            nxt = below + (gotos[below[-1]][origin],)
            # a general parse may meet a stack again: each terminal goes on from it once
            done = seen.setdefault(nxt, set())
            group = [x for x in group if x not in done]
            if not group:
                continue
            done.update(group)
            if len(seen) > MAX_FORKS:  # push_all decides (and raises) terminal by terminal
                return _shiftable_each(tables, stack, terms)
            todo.append((nxt, group))
    return list(out), max(lowest, 0)


def _shiftable_each(tables: Tables, stack: tuple[int, ...], terms) -> tuple[list[str], int]:
    lowest = len(stack) - 1
    out = []
    for term in terms:
        sts, low = push_all(tables, stack, term)
        lowest = min(lowest, low)
        if sts:
            out.append(term)
    return out, max(lowest, 0)


def accepts_end(tables: Tables, stack: tuple[int, ...]) -> tuple[bool, int]:
    """Whether the input may end here (Lark's ``$END`` handling), and the lowest index read."""
    if tables.forks:
        return _accepts_end_forked(tables, stack)
    actions, gotos, rules, end = tables.actions, tables.gotos, tables.rules, tables.end
    lowest = len(stack) - 1
    cut = len(stack)  # the stack is stack[:cut] + tail (see ``push``)
    tail: list[int] = []
    top = stack[-1]
    while True:
        act = actions[top].get(END)
        if act is None or act[0]:
            return False, lowest
        origin, n = rules[act[1]]
        if n:
            k = len(tail)
            if n <= k:
                del tail[k - n :]
            else:
                cut -= n - k
                tail.clear()
            if cut + len(tail) - 1 < lowest:
                lowest = cut + len(tail) - 1
        g = gotos[tail[-1] if tail else stack[cut - 1]].get(origin)
        if g is None:
            return False, lowest
        if g == end:
            return True, lowest
        top = g
        tail.append(g)


def _accepts_end_forked(tables: Tables, stack: tuple[int, ...]) -> tuple[bool, int]:
    actions, gotos, rules, end, forks = tables.actions, tables.gotos, tables.rules, tables.end, tables.forks
    lowest = len(stack) - 1
    todo = [stack]
    seen = {stack}
    while todo:
        st = todo.pop()
        act = actions[st[-1]].get(END)
        if act is None:
            continue
        for is_shift, arg in forks.get((st[-1], END), (act,)):
            if is_shift:
                continue
            origin, n = rules[arg]
            below = st[:-n] if n else st
            lowest = min(lowest, len(below) - 1)
            g = gotos[below[-1]].get(origin)
            if g is None:
                continue
            if g == end:
                return True, max(lowest, 0)
            nxt = below + (g,)
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
                if len(seen) > MAX_FORKS:
                    raise GrammarError(f"the grammar is too ambiguous here (over {MAX_FORKS} parses)")
    return False, max(lowest, 0)


def _reductions(tables: Tables, stack: tuple[int, ...]) -> list[tuple[int, tuple[int, ...] | None]]:
    """(minlen(beta), stack after reducing A) for each kernel item ``A -> alpha . beta`` of the top
    state, sorted by minlen(beta); None for the root item (accept after beta)."""
    out: list[tuple[int, tuple[int, ...] | None]] = []
    for origin, alpha, beta in tables.kernels[stack[-1]]:
        if origin == ROOT:
            out.append((beta, None))
            continue
        below = stack[:-alpha] if alpha else stack
        if not below:
            continue
        g = tables.gotos[below[-1]].get(origin)
        if g is not None:
            out.append((beta, below + (g,)))
    return out


def completion_cost(tables: Tables, stack: tuple[int, ...], memo: dict) -> int:
    """Bytes of the shortest terminal string that completes ``stack`` (INF if none).

    Every LR(0) kernel item ``A -> alpha . beta`` of the top state is valid for the stack, so the
    cost is the minimum over them of ``minlen(beta)`` plus the cost after reducing ``A``. Iterative
    (stacks may be thousands deep); ``memo`` maps stacks to costs.
    """
    got = memo.get(stack)
    if got is not None:
        return got
    memo[stack] = INF  # in progress: guards against unit-rule cycles
    frames: list[list] = [[stack, _reductions(tables, stack), 0, INF]]
    while frames:
        frame = frames[-1]
        st, children, i, best = frame
        if i < len(children):
            beta, child = children[i]
            if beta >= best:  # sorted by beta: nothing later can be cheaper
                frame[2] = len(children)
                continue
            if child is None:
                frame[3], frame[2] = beta, len(children)
                continue
            c = memo.get(child)
            if c is None:
                memo[child] = INF
                frames.append([child, _reductions(tables, child), 0, INF])
                continue  # come back to index i once the child is known
            if beta + c < best:
                frame[3] = beta + c
            frame[2] = i + 1
        else:
            memo[st] = best
            frames.pop()
    return memo[stack]


class DepthMemo:
    """A cache keyed by the *top* of a stack: a value computed from ``stack[lowest:]`` only is valid
    for every stack that ends with the same entries.

    Give it values the garbage collector stops tracking (tuples of ints, strings, numpy arrays): a
    grammar's memos hold thousands, and every full collection walks the tracked ones while it lives."""

    __slots__ = ("_depths", "_store")

    def __init__(self) -> None:
        self._depths: dict[tuple, tuple[int, ...]] = {}  # (extra, top) -> the depths stored, ascending
        self._store: dict[tuple, object] = {}

    def get(self, extra, stack: tuple[int, ...]):
        ks = self._depths.get((extra, stack[-1]))
        if ks is not None:
            n = len(stack)
            for k in ks:
                if k <= n:
                    v = self._store.get((extra, stack[n - k :]))
                    if v is not None:
                        return v
        return None

    def put(self, extra, stack: tuple[int, ...], lowest: int, value) -> None:
        k = len(stack) - max(lowest, 0)
        self._store[(extra, stack[len(stack) - k :])] = value
        top = (extra, stack[-1])
        ks = self._depths.get(top, ())
        if k not in ks:
            self._depths[top] = tuple(sorted((*ks, k)))

    def __len__(self) -> int:
        return len(self._store)
