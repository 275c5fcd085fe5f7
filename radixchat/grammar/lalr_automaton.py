"""The LALR(1) automaton's construction on integers: LR(0) item sets and DeRemer-Pennello lookaheads,
as Lark builds them, without Lark's per-symbol objects. It builds the automaton only; ``lalr_tables``
turns it into a grammar's ``Tables`` and ``lalr_stack`` runs parsers over those.

``lark.parsers.lalr_analysis`` hashes ``RulePtr``/``Symbol`` objects (Python ``__eq__``/``__hash__``) in
every set operation and first computes FIRST/FOLLOW sets that LALR does not use: on generated
JSON-Schema grammars of a few thousand states that was most of the compile time. Here items
are ints (``rule base + dot``), terminal sets are int bitsets and the relations are lists of ints; the
result is the same automaton with the same lookaheads (checked against Lark's in
``tests/grammar/test_grammar_lr.py``).

Kept from Lark on purpose, so that the tables stay the same:
- ``includes`` also walks the kernel items ``B -> alpha . omega`` of the state a ``B`` transition leaves
  (Lark's ``compute_includes_lookback`` walks every closure item whose origin is ``B``); this can only
  add lookaheads (an extra reduce delays an error, it never accepts a wrong input);
- on a reduce/reduce tie the rules of the highest priority are kept, ordered by ``str(rule)``, after
  the shift.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import GrammarError, TooManyStates
from .limits import check

END = "$END"


def digraph(n: int, rel: list[list[int]], base: list[int]) -> list[int]:
    """DeRemer-Pennello's digraph: ``F(x) = base(x) | F(y) for every y with x rel y`` over bitsets;
    iterative (a big grammar's relations are deep chains); strongly connected nodes share ``F``."""
    f = list(base)
    depth = [0] * n
    stack: list[int] = []
    for x0 in range(n):
        if depth[x0]:
            continue
        stack.append(x0)
        depth[x0] = len(stack)
        work = [[x0, 0, len(stack)]]
        while work:
            fr = work[-1]
            x = fr[0]
            ys = rel[x]
            if fr[1] < len(ys):
                y = ys[fr[1]]
                dy = depth[y]
                if dy == 0:
                    stack.append(y)
                    depth[y] = len(stack)
                    work.append([y, 0, len(stack)])
                    continue  # back here when y is done
                fr[1] += 1
                if 0 < dy < depth[x]:
                    depth[x] = dy
                f[x] |= f[y]
                continue
            if depth[x] == fr[2]:
                fx = f[x]
                while True:
                    z = stack.pop()
                    depth[z] = -1
                    f[z] = fx
                    if z == x:
                        break
            work.pop()
    return f


@dataclass(slots=True)
class Automaton:
    """The LALR(1) automaton of a grammar. Symbols are ints: terminals ``0..n_terms-1`` (``$END`` is
    ``n_terms - 1``), nonterminals from ``n_terms``; rule ``k`` is ``rules[k]`` (Lark's ``Rule``), the
    root rule ``$root_<start> -> start`` is the last one."""

    names: list[str]
    n_terms: int
    rules: list  # Lark Rule objects (None for the root rule)
    origin: list[int]
    expansion: list[tuple[int, ...]]
    kernels: list[tuple[tuple[int, int], ...]]  # per state: (rule, dot) of its kernel items
    trans: list[dict[int, int]]  # per state: symbol -> state
    reduces: list[dict[int, int]]  # per state: rule -> lookahead bitset
    start: int
    end: int


def build_automaton(rules: list, start: str, max_states: int, source: str) -> Automaton:
    """Build the LALR(1) automaton of Lark's compiled ``rules`` (``grammar.compile``'s) for ``start``."""
    # -- symbols and rules as ints ------------------------------------------------------------------
    term_id: dict[str, int] = {}
    for r in rules:
        for s in r.expansion:
            if s.is_term and s.name not in term_id:
                term_id[str(s.name)] = len(term_id)
    n_terms = len(term_id) + 1
    names = list(term_id) + [END]
    nt_id: dict[str, int] = {}
    for r in rules:
        if r.origin.name not in nt_id:
            nt_id[str(r.origin.name)] = n_terms + len(nt_id)
            names.append(str(r.origin.name))  # plain str: Lark's Tokens compare slowly at run time
    root_name = "$root_" + start
    if start not in nt_id:
        raise GrammarError(f"{source}: not LALR(1): Using an undefined rule: NonTerminal({start!r})")
    nt_id[root_name] = n_terms + len(nt_id)
    names.append(root_name)
    origin: list[int] = []
    expansion: list[tuple[int, ...]] = []
    for r in rules:
        origin.append(nt_id[r.origin.name])
        exp = []
        for s in r.expansion:
            k = term_id[s.name] if s.is_term else nt_id.get(s.name)
            if k is None:
                raise GrammarError(f"{source}: not LALR(1): Using an undefined rule: {s!r}")
            exp.append(k)
        expansion.append(tuple(exp))
    root = len(rules)
    origin.append(nt_id[root_name])
    expansion.append((nt_id[start],))
    n_rules = len(origin)
    by_origin: dict[int, list[int]] = {}
    for k in range(n_rules):
        by_origin.setdefault(origin[k], []).append(k)

    # items: base[k] + dot; nxt[item] = the symbol after the dot (-1 at the end)
    base = [0] * (n_rules + 1)
    for k in range(n_rules):
        base[k + 1] = base[k] + len(expansion[k]) + 1
    nxt = [-1] * base[-1]
    item_rule = [0] * base[-1]
    for k in range(n_rules):
        b = base[k]
        for d, s in enumerate(expansion[k]):
            nxt[b + d] = s
        for d in range(len(expansion[k]) + 1):
            item_rule[b + d] = k

    # nullable nonterminals
    nullable = [False] * len(names)
    changed = True
    while changed:
        changed = False
        for k in range(n_rules):
            if not nullable[origin[k]] and all(nullable[s] for s in expansion[k]):
                nullable[origin[k]] = changed = True

    # closure items of a nonterminal: its rules at dot 0, and theirs for leading nonterminals
    expand: dict[int, frozenset[int]] = {}

    def closure_of(a: int) -> frozenset[int]:
        got = expand.get(a)
        if got is None:
            out: set[int] = set()
            seen = {a}
            todo = [a]
            while todo:
                x = todo.pop()
                for k in by_origin[x]:
                    it = base[k]
                    out.add(it)
                    s = nxt[it]
                    if s >= n_terms and s not in seen:
                        seen.add(s)
                        todo.append(s)
            got = expand[a] = frozenset(out)
        return got

    # -- LR(0) item sets ----------------------------------------------------------------------------
    start_kernel = frozenset((base[root],))
    index: dict[frozenset[int], int] = {start_kernel: 0}
    kernels: list[frozenset[int]] = [start_kernel]
    trans: list[dict[int, int]] = []
    completed: list[list[int]] = []  # per state: the rules whose items are complete there
    q = 0
    while q < len(kernels):
        if q % 256 == 0:
            check()
        kernel = kernels[q]
        closure = set(kernel)
        for it in kernel:
            s = nxt[it]
            if s >= n_terms:
                closure |= closure_of(s)
        groups: dict[int, list[int]] = {}
        done = []
        for it in closure:
            s = nxt[it]
            if s < 0:
                done.append(item_rule[it])
            else:
                g = groups.get(s)
                if g is None:
                    groups[s] = [it + 1]
                else:
                    g.append(it + 1)
        tr: dict[int, int] = {}
        for s, its in groups.items():
            k2 = frozenset(its)
            dest = index.get(k2)
            if dest is None:
                dest = index[k2] = len(kernels)
                kernels.append(k2)
            tr[s] = dest
        trans.append(tr)
        completed.append(done)
        q += 1
        if len(kernels) > max_states:
            raise TooManyStates(
                f"{source}: {len(kernels)}+ LALR states (limit {max_states}); "
                "avoid `x?`/[x] on many items in one rule, use helper rules"
            )
    n_states = len(kernels)
    check()

    # -- lookaheads (DeRemer & Pennello, as Lark) ----------------------------------------------------
    # nonterminal transitions (p, A) are numbered; ntt[p][A] = number
    ntt: list[dict[int, int]] = []
    nt_from: list[int] = []
    nt_sym: list[int] = []
    for p in range(n_states):
        d = {}
        for s in trans[p]:
            if s >= n_terms:
                d[s] = len(nt_from)
                nt_from.append(p)
                nt_sym.append(s)
        ntt.append(d)
    n_nt = len(nt_from)
    # Read(p, A) depends only on r = goto(p, A): r's terminal transitions, and Read of r's transitions
    # on nullable nonterminals. One digraph over states, not over transitions (objects of optional
    # properties have a nullable transition per remaining property in every state: far fewer edges).
    shifts = [0] * n_states
    nullable_next: list[list[int]] = [[] for _ in range(n_states)]
    for r in range(n_states):
        bits = 0
        for s, dest in trans[r].items():
            if s < n_terms:
                bits |= 1 << s
            elif nullable[s]:
                nullable_next[r].append(dest)
        shifts[r] = bits
    read_state = digraph(n_states, nullable_next, shifts)
    read = [read_state[trans[nt_from[x]][nt_sym[x]]] for x in range(n_nt)]
    x0 = ntt[0].get(nt_id[start])
    if x0 is not None:  # state 0 is no goto target: nothing reads (0, start)
        read[x0] |= 1 << (n_terms - 1)
    check()

    # nullable_after[item]: every symbol after the one at the dot is nullable
    nullable_after = [False] * base[-1]
    for k in range(n_rules):
        exp = expansion[k]
        ok = True
        for d in range(len(exp) - 1, -1, -1):
            nullable_after[base[k] + d] = ok
            ok = ok and nullable[exp[d]]
    includes: list[list[int]] = [[] for _ in range(n_nt)]
    lookback: list[list[tuple[int, int]]] = [[] for _ in range(n_nt)]
    kernel_by_origin: list[dict[int, list[int]]] = []
    for p in range(n_states):
        d: dict[int, list[int]] = {}
        for it in kernels[p]:
            d.setdefault(origin[item_rule[it]], []).append(it)
        kernel_by_origin.append(d)
    for x in range(n_nt):
        if x % 1024 == 0:
            check()
        p, a = nt_from[x], nt_sym[x]
        starts = [base[k] for k in by_origin[a]] + kernel_by_origin[p].get(a, [])
        seen_inc: set[int] = set()
        for it in starts:
            k = item_rule[it]
            st = p
            for i in range(it - base[k], len(expansion[k])):
                s = expansion[k][i]
                if s >= n_terms and nullable_after[base[k] + i]:
                    y = ntt[st][s]
                    if y not in seen_inc:
                        seen_inc.add(y)
                        includes[y].append(x)
                st = trans[st][s]
            if it == base[k]:
                lookback[x].append((st, k))
    check()
    follow = digraph(n_nt, includes, read)
    check()
    reduces: list[dict[int, int]] = [{} for _ in range(n_states)]
    for x in range(n_nt):
        fx = follow[x]
        if not fx:
            continue
        for st, k in lookback[x]:
            red = reduces[st]
            red[k] = red.get(k, 0) | fx
    end = trans[0][nt_id[start]]
    return Automaton(
        names,
        n_terms,
        list(rules) + [None],
        origin,
        expansion,
        [tuple((item_rule[it], it - base[item_rule[it]]) for it in kern) for kern in kernels],
        trans,
        reduces,
        0,
        end,
    )
