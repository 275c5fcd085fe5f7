"""Lark grammar -> LALR(1) tables (``Tables``) and its terminals as byte DFAs: what a grammar compiles to.

We use Lark for what it is good at (the grammar language, EBNF expansion, ``%import``) and read its
compiled rules into plain dicts. The automaton itself comes from Lark's LALR analysis (strict: a
shift/reduce conflict is an error, not a silent shift) or, for generated grammars whose conflicts are
kept, from our own construction on ints (``lalr_automaton``). What a parser does with the tables at
run time (stacks) is ``lalr_stack``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lark.common import ParserConf
from lark.exceptions import LarkError
from lark.lexer import PatternStr
from lark.load_grammar import load_grammar
from lark.parsers.lalr_analysis import LALR_Analyzer, Reduce, Shift

from .errors import GrammarError, TooManyStates
from .lalr_automaton import END, build_automaton
from .lexer_space import SPACE
from .limits import check

INF = 1 << 40
ROOT = "$root"


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
    is then built by ``lalr_automaton.build_automaton`` (the same tables, much sooner on big generated
    grammars), or by Lark's analyser when ``lark_analysis`` (the reference, for tests). ``grammar``: what Lark's
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
    """``lalr_automaton.build_automaton``'s automaton as tables, every conflict kept (as ``_all_actions``)."""
    a = build_automaton(rules, start, max_states, source)
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
