"""Lark grammar -> LALR(1) tables, terminals as byte DFAs, and the pure functions over parser stacks.

We use Lark for what it is good at (the grammar language, EBNF expansion, ``%import``, the LALR
construction) and read its tables into plain dicts. Stacks are tuples of LALR state numbers; every
function that looks at a stack also reports the *lowest index it read*, so that results can be cached
under the top of the stack only (see ``DepthMemo``).

Lark is built with ``strict=True``: shift/reduce conflicts are errors, not silent shifts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lark.common import ParserConf
from lark.exceptions import LarkError
from lark.lexer import PatternStr
from lark.load_grammar import load_grammar
from lark.parsers.lalr_analysis import LALR_Analyzer, Reduce, Shift

from .errors import GrammarError, TooManyStates
from .lexer_space import SPACE
from .limits import check
from .lr import lalr

INF = 1 << 40
ROOT = "$root"
END = "$END"


@dataclass(slots=True)
class Terminal:
    """One terminal of a grammar and how Lark would rank it against others matching the same text."""

    name: str
    pattern: str
    dfa: int
    priority: int
    literal: str | None  # the exact text for flag-less string literals
    is_str: bool
    max_width: int
    value_len: int
    ignore: bool
    minlen: int

    @property
    def rank(self) -> tuple:
        # Lark's lexer order (lexer.py sorts by this) with literals first on exact ties ("unless").
        return (-self.priority, not self.is_str, -self.max_width, -self.value_len, self.name)


@dataclass(slots=True)
class Tables:
    """LALR(1) tables of one grammar. ``actions[q][T] = (is_shift, state or rule index)``."""

    actions: list[dict[str, tuple[bool, int]]]
    gotos: list[dict[str, int]]
    rules: list[tuple[str, int]]
    kernels: list[tuple[tuple[str, int, int], ...]]  # per state, sorted (tuples: untracked by the collector)
    start: int
    end: int
    terminals: dict[str, Terminal]
    ignore: tuple[str, ...]
    minlen: dict[str, int]
    #: Conflicts kept for the general (GLR) parser: ``forks[(q, T)]`` lists every action; ``actions[q][T]``
    #: holds the first. Empty for LALR(1) grammars (the fast, deterministic path).
    forks: dict[tuple[int, str], tuple[tuple[bool, int], ...]]
    #: ``shiftable``'s view of ``actions``: a bit per terminal (and ``$END``), and per state, built when
    #: first asked, ``[(is_shift, state or rule, bits of the terminals taking that action)]``.
    bits: dict[str, int] = field(default_factory=dict)
    # Caches filled by the masks. Their values are tuples of ints and strings, which the garbage
    # collector stops tracking (lists would be walked by every full collection while the grammar lives).
    by_action: dict[int, tuple[tuple[bool, int, int], ...]] = field(default_factory=dict)
    reductions: dict[tuple[int, int], tuple[int, tuple]] = field(default_factory=dict)  # see _reduce_above
    pushes: dict[tuple[int, str], tuple | None] = field(default_factory=dict)  # see _push_above

    @property
    def n_states(self) -> int:
        return len(self.actions)

    def __post_init__(self) -> None:
        self.bits.update((name, 1 << i) for i, name in enumerate(["$END", *self.terminals]))

    def actions_by_bits(self, q: int) -> tuple[tuple[bool, int, int], ...]:
        got = self.by_action.get(q)
        if got is None:
            acts: dict[tuple[bool, int], int] = {}
            for term, act in self.actions[q].items():
                acts[act] = acts.get(act, 0) | self.bits[term]
            got = self.by_action[q] = tuple((a[0], a[1], m) for a, m in acts.items())
        return got


def _short(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return " ".join(lines[:2])[:300] if lines else type(e).__name__


def build_tables(
    text: str,
    source: str = "<grammar>",
    start: str = "start",
    max_states: int = 20_000,
    glr: bool = False,
    lark_analysis: bool = False,
    grammar: tuple | None = None,
) -> Tables:
    """Load Lark grammar text and build LALR(1) tables. Raises GrammarError.

    Strict by default: a conflict is an error (Lark's analysis). With ``glr``, conflicts are kept
    (``Tables.forks``) for a general parser that follows every action (``push_all``); the automaton
    is then built by ``lr.lalr`` (the same tables, ~10x faster on big generated grammars), or by
    Lark's analyser when ``lark_analysis`` (the reference, for tests). ``grammar``: what Lark's
    ``load_grammar(text).compile([start])`` returns for ``text``, when the caller has it already
    (``LarkWriter.compiled``: generated grammars skip Lark's grammar parser)."""
    if grammar is not None:
        terms, rules, ignore = grammar
    else:
        try:
            loaded, _ = load_grammar(text, source, None, False)
            terms, rules, ignore = loaded.compile([start], set())
        except LarkError as e:
            raise GrammarError(f"{source}: {_short(e)}") from None
    if glr and not lark_analysis:
        actions, gotos, rule_list, kernel_items, start_q, end_q, forks = _fast_tables(
            rules, start, max_states, source
        )
    else:
        actions, gotos, rule_list, kernel_items, start_q, end_q, forks = _lark_tables(
            rules, start, max_states, source, glr
        )
    check()
    terminals: dict[str, Terminal] = {}
    for t in terms:
        pattern = t.pattern.to_regexp()
        d = SPACE.dfa_id(pattern, f"{source}: terminal {t.name}")
        is_str = isinstance(t.pattern, PatternStr)
        terminals[t.name] = Terminal(
            name=t.name,
            pattern=pattern,
            dfa=d,
            priority=t.priority,
            literal=t.pattern.value if is_str and not t.pattern.flags else None,
            is_str=is_str,
            max_width=t.pattern.max_width,
            value_len=len(t.pattern.value),
            ignore=t.name in ignore,
            minlen=SPACE.dfas[d].shortest(),
        )
    minlen = _min_lengths(rules, terminals)
    for r in rules:
        if minlen.get(r.origin.name, INF) >= INF:
            raise GrammarError(
                f"{source}: rule {r.origin.name!r} can never be completed (no finite expansion)"
            )
    kernels: list[tuple[tuple[str, int, int], ...]] = []
    for items in kernel_items:
        out = set()
        for origin, index, rest in items:
            beta = sum(minlen.get(sym, INF) for sym in rest)
            out.add((ROOT if origin.startswith("$root_") else origin, index, min(beta, INF)))
        kernels.append(tuple(sorted(out, key=lambda it: (it[2], it[0], it[1]))))
    return Tables(actions, gotos, rule_list, kernels, start_q, end_q, terminals, tuple(ignore), minlen, forks)


def _fast_tables(rules, start: str, max_states: int, source: str):
    """``lr.lalr``'s automaton as tables, every conflict kept (as ``_all_actions``)."""
    a = lalr(rules, start, max_states, source)
    names, n_terms = a.names, a.n_terms
    rule_idx: dict[int, int] = {}
    rule_list: list[tuple[str, int]] = []
    actions: list[dict[str, tuple[bool, int]]] = []
    gotos: list[dict[str, int]] = []
    forks: dict[tuple[int, str], tuple[tuple[bool, int], ...]] = {}

    def rule_no(k: int) -> int:
        got = rule_idx.get(k)
        if got is None:
            got = rule_idx[k] = len(rule_list)
            rule_list.append((names[a.origin[k]], len(a.expansion[k])))
        return got

    for q, tr in enumerate(a.trans):
        acts: dict[str, tuple[bool, int]] = {}
        gts: dict[str, int] = {}
        for s, dest in tr.items():
            if s < n_terms:
                acts[names[s]] = (True, dest)
            else:
                gts[names[s]] = dest
        by_la: dict[int, list[int]] = {}
        for k, bits in a.reduces[q].items():
            while bits:
                low = bits & -bits
                by_la.setdefault(low.bit_length() - 1, []).append(k)
                bits ^= low
        for t, ks in by_la.items():
            name = names[t]
            if len(ks) > 1:
                prio = [(a.rules[k].options.priority or 0) for k in ks]
                top = max(prio)
                ks = sorted((k for k, p in zip(ks, prio) if p == top), key=lambda k: str(a.rules[k]))
            shift = acts.get(name)
            _keep(acts, forks, q, name, ([shift] if shift else []) + [(False, rule_no(k)) for k in ks])
        actions.append(acts)
        gotos.append(gts)
    kernel_items = [
        [(names[a.origin[k]], d, [names[s] for s in a.expansion[k][d:]]) for k, d in kern]
        for kern in a.kernels
    ]
    return actions, gotos, rule_list, kernel_items, a.start, a.end, forks


def _keep(acts: dict, forks: dict, q: int, sym: str, options: list[tuple[bool, int]]) -> None:
    """State ``q``'s actions on ``sym``: the first is the one LALR(1) takes, all of them (a conflict,
    kept for the general parser) go to ``forks``."""
    acts[sym] = options[0]
    if len(options) > 1:
        forks[(q, sym)] = tuple(options)


def _lark_tables(rules, start: str, max_states: int, source: str, glr: bool):
    """Lark's LALR analysis (strict: conflicts are errors; ``glr``: every action kept)."""
    conf = ParserConf(rules, {}, [start])
    try:
        analyzer = LALR_Analyzer(conf, debug=True, strict=True)
        analyzer.compute_lr0_states()
        if len(analyzer.lr0_itemsets) > max_states:
            raise TooManyStates(
                f"{source}: {len(analyzer.lr0_itemsets)} LALR states (limit {max_states}); "
                "avoid `x?`/[x] on many items in one rule, use helper rules"
            )
        check()
        analyzer.compute_reads_relations()
        analyzer.compute_includes_lookback()
        analyzer.compute_lookaheads()
        if not glr:
            analyzer.compute_lalr1_states()
    except LarkError as e:
        raise GrammarError(f"{source}: not LALR(1): {_short(e)}") from None
    table = _all_actions(analyzer, start) if glr else analyzer.parse_table
    by_closure = {s.closure: s for s in analyzer.lr0_itemsets}
    states = list(table.states)
    idx = {s: i for i, s in enumerate(states)}
    term_names = {t.name for r in rules for t in r.expansion if t.is_term} | {END}
    rule_idx: dict = {}
    rule_list: list[tuple[str, int]] = []
    actions: list[dict[str, tuple[bool, int]]] = []
    gotos: list[dict[str, int]] = []
    forks: dict[tuple[int, str], tuple[tuple[bool, int], ...]] = {}
    for q, s in enumerate(states):
        acts: dict[str, tuple[bool, int]] = {}
        gts: dict[str, int] = {}
        for sym, entry in table.states[s].items():
            options = []
            for action, arg in entry if glr else [entry]:
                if action is Shift:
                    if sym in term_names:
                        options.append((True, idx[arg]))
                    else:
                        gts[str(sym)] = idx[arg]
                else:
                    k = rule_idx.get(arg)
                    if k is None:
                        k = rule_idx[arg] = len(rule_list)
                        # plain str: Lark's names are Tokens, whose Python-level __eq__ slows every
                        # gotos lookup at run time
                        rule_list.append((str(arg.origin.name), len(arg.expansion)))
                    options.append((False, k))
            if options:
                _keep(acts, forks, q, sym, options)
        actions.append(acts)
        gotos.append(gts)
    kernel_items = [
        [
            (str(rp.rule.origin.name), rp.index, [sym.name for sym in rp.rule.expansion[rp.index :]])
            for rp in by_closure[s].kernel
        ]
        for s in states
    ]
    return (
        actions,
        gotos,
        rule_list,
        kernel_items,
        idx[table.start_states[start]],
        idx[table.end_states[start]],
        forks,
    )


class _Table:
    """``states[closure][symbol]`` = [(Shift, closure) | (Reduce, rule), ...] with every conflict kept."""

    def __init__(self, states: dict, start_states: dict, end_states: dict) -> None:
        self.states, self.start_states, self.end_states = states, start_states, end_states


def _all_actions(analyzer, start: str) -> _Table:
    """Lark's ``compute_lalr1_states`` without resolving conflicts: a rule of higher priority still wins
    a reduce/reduce tie, as in Lark; everything else stays, for ``push_all``."""
    states: dict = {}
    for itemset in analyzer.lr0_itemsets:
        acts: dict[str, list] = {la.name: [(Shift, nxt.closure)] for la, nxt in itemset.transitions.items()}
        for la, rules in itemset.lookaheads.items():
            top = max((r.options.priority or 0) for r in rules)
            best = [r for r in rules if (r.options.priority or 0) == top]
            acts.setdefault(la.name, []).extend((Reduce, r) for r in sorted(best, key=str))
        states[itemset.closure] = acts
    end_states = {}
    for closure in states:
        for rp in closure:
            if rp.rule.origin.name == "$root_" + start and rp.is_satisfied:
                end_states[start] = closure
    return _Table(states, {start: analyzer.lr0_start_states[start].closure}, end_states)


def _min_lengths(rules, terminals: dict[str, Terminal]) -> dict[str, int]:
    """Shortest expansion of every symbol, in bytes (terminals: their DFA's shortest match)."""
    ml: dict[str, int] = {name: t.minlen for name, t in terminals.items()}
    changed = True
    while changed:
        changed = False
        for r in rules:
            total = 0
            for sym in r.expansion:
                total += ml.get(sym.name, INF)
                if total >= INF:
                    break
            if total < ml.get(r.origin.name, INF):
                ml[r.origin.name] = total
                changed = True
    return ml


# ---------------------------------------------------------------------------------------------------
# Stack functions. ``lowest`` is the lowest stack index whose value the function read.


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
