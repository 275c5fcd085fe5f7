"""A compiled grammar: LALR tables + terminal DFAs + the two-level mask cache for one tokenizer.

The state of a constrained generation is ``(stack, lex)``: the LALR stack (a tuple) and the lexer
state of the lexeme in progress. Lexing is greedy and byte-level: a lexeme ends only when the next
byte cannot continue it (and it is then accepting); it is then fed to the parser, and the next lexeme
starts in the *context* of the new stack: the terminals the parser can really shift there (after
reductions), plus the ``%ignore`` terminals unless (a) the lexeme just ended was ignored (so
whitespace runs stay bounded: one ignored lexeme at a time) or (b) only the end of input may follow.

Masks come from two caches:
1. ``RunCache.lexrun(lex)`` (``run_cache``), per lexer state and tokenizer, shared by all grammars: which tokens stay inside
   the lexeme, which end it and where.
2. ``CompiledGrammar.entry(stack, lex)``, per grammar, keyed by ``lex`` and only the top of the stack
   that the computation read (``DepthMemo``). Entries hold interned mask arrays (one per distinct mask).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .budget import budget_mask, token_costs
from .errors import GrammarError
from .lalr_stack import MAX_FORKS, DepthMemo, accepts_end, completion_cost, push_all, shiftable
from .lalr_tables import INF, Tables, build_tables
from .lexer_space import DEAD, SPACE
from .limits import gc_paused, past_deadline
from .matcher import GrammarMatcher
from .run_cache import RunCache
from .tokenizer import TokenizerInfo
from .vocab_runs import LexRun

#: Rule-name prefixes of an embedded string grammar: ``verbatim_str…: QUOTE verbatim_in…_start QUOTE``.
#: Between its quotes the text is verbatim (no ignored whitespace); see ``schema.string_grammar``.
VERBATIM_STR = "verbatim_str"
VERBATIM_IN = "verbatim_in"


def _grammar_dirs() -> tuple[Path, ...]:
    """User grammars first (``$XDG_CONFIG_HOME/radixchat/grammars``), then the shipped ones: the
    checkout's ``grammars/`` and the package's ``radixchat/grammars`` (a link to it, so wheels carry it)."""
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    here = Path(__file__).resolve()
    return (config / "radixchat" / "grammars", here.parents[2] / "grammars", here.parents[1] / "grammars")


@dataclass(slots=True, frozen=True)
class Entry:
    """The mask of one state. ``tensor`` is interned and must not be mutated; ``mask`` is its numpy view."""

    tensor: torch.Tensor
    mask: np.ndarray
    accepting: bool
    only_eos: bool
    depth: int


@dataclass(slots=True, frozen=True)
class Context:
    lex0: int  # lexer state at the start of the next lexeme (DEAD if no terminal may follow)
    end_ok: bool  # the input may end here
    #: DFAs ``lex0`` lexes that the parser does not take here (a key family's; see ``families``): a
    #: token that only they keep alive is not allowed.
    drop: frozenset[int] = frozenset()


RECENT_ENTRIES = 1024  # Entry objects a grammar keeps (see ``CompiledGrammar._recent``)
PREPARED_STATES = 512  # string states a compile runs ahead of the masks (``CompiledGrammar._prepare``)


class CompiledGrammar:
    """A Lark grammar compiled for one tokenizer. Create matchers with ``matcher()``.

    Thread-safety: caches are plain dicts filled under the GIL; two threads may compute the same
    entry twice, never a wrong one.
    """

    def __init__(
        self,
        text: str,
        info: TokenizerInfo,
        *,
        source: str = "<grammar>",
        start: str = "start",
        max_states: int = 20_000,
        glr: bool = False,
        grammar: tuple | None = None,
        families: Iterable[tuple[str, frozenset[str], tuple[str, ...]]] = (),
    ) -> None:
        self.text = text
        self.source = source
        self.start = start
        self.info = info
        #: The runs of the vocabulary through lexer states, and the interned masks: one cache per tokenizer,
        #: shared by every grammar compiled for it (level 1 of the module docstring).
        self.runs = RunCache.of(info)
        #: A general parser: LALR conflicts fork the parse, and a lexeme that several terminals accept
        #: stands for each of them (generated grammars, whose unions may overlap). Else strict LALR(1)
        #: with Lark's terminal ranking.
        self.glr = glr
        #: Schema keywords this grammar does not enforce (lenient JSON Schemas; see schema.json_schema).
        self.not_enforced: tuple[str, ...] = ()
        #: ``grammar``: Lark's compiled form of ``text`` when the caller built it (see ``build_tables``).
        with gc_paused():
            self.tables: Tables = build_tables(text, source, start, max_states, glr=glr, grammar=grammar)
        t = self.tables
        self.ignore = frozenset(t.ignore)
        #: States inside a string whose content follows an embedded grammar (``schema.string_grammar``):
        #: its text is verbatim, so ``%ignore`` terminals (JSON whitespace) are not allowed there.
        self.verbatim = frozenset(
            q
            for q, kernel in enumerate(t.kernels)
            if any(o.startswith(VERBATIM_IN) or (o.startswith(VERBATIM_STR) and b > 0) for o, _, b in kernel)
        )
        # DFA id -> terminal; if two terminals share a pattern Lark's first-ranked one wins.
        self.dfa_term: dict[int, str] = {}
        for term in sorted(t.terminals.values(), key=lambda x: x.rank):
            self.dfa_term.setdefault(term.dfa, term.name)
        self.runs.prepare(self.dfa_term)
        self._rank = {name: term.rank for name, term in t.terminals.items()}
        self._choose: dict[int, tuple[str, ...]] = {}
        self._unions: dict = {}
        self._ctx = DepthMemo()
        self._lookahead: dict[int, tuple[str, ...]] = {}  # LALR state -> its non-ignored lookaheads
        # The parser contexts met, two per set of terminals taken (the input may end there or not); the
        # context memo ``_ctx`` stores their index, so it holds only ints (see ``DepthMemo``).
        self._lex0: dict[frozenset, int] = {}  # terminals -> their first context in _contexts
        self._contexts: list[Context] = []
        #: Key families (from ``schema.json_objects``): an open object's extra-key terminal W and the keys
        #: of the names it excludes. Where W may come the parser takes only some of those names (the
        #: ones not yet written), a different set at each position: lexing with all of them instead
        #: gives one lexer state per object, whose runs over the vocabulary are computed once, not once
        #: per position. It is exact for keys: a name's proper prefixes are W's too, and nothing goes
        #: on after a key's closing quote, so a token is allowed iff it keeps a terminal the parser
        #: takes alive (``Context.drop``, checked in ``entry`` and ``feed``) or ends one.
        families = [f for f in families if f[0] in t.terminals]
        self._families = [
            (w, frozenset(m for m in members if m in t.terminals)) for w, members, _ in families
        ]
        self._drop_bad: dict[tuple[int, frozenset[int]], np.ndarray] = {}
        self._prepare([names for _, _, names in families])
        # Mask entries, stored as (mask, accepting, only_eos, depth) tuples, and the Entry objects (each
        # with its tensor) of the last ones asked for: the collector tracks those, so they are bounded.
        self._entries = DepthMemo()
        self._recent: dict[int, tuple[tuple, Entry]] = {}  # id of a memo tuple -> (it, its Entry)
        self._cp_memo: dict = {}
        self._cost_memo: dict = {}
        self._budget: OrderedDict = OrderedDict()
        # Special tokens whose text is a literal of this grammar may match it (and only it).
        literals = {term.literal for term in t.terminals.values() if term.literal}
        self.named_special = [
            (i, s.encode()) for i, s in info.special_text.items() if s in literals and i not in info.eos_ids
        ]
        self._token_bytes = dict(self.named_special)
        self._non_text = np.array([tid for tid, _ in self.named_special] + list(info.eos_ids), dtype=np.int64)
        longest = max([term.minlen for term in t.terminals.values()] + [0])
        widest_rule = max([v for v in t.minlen.values() if v < INF] + [0])
        #: allowed(remaining) checks budgets exactly only when remaining < cost + horizon.
        self.horizon = info.max_token_bytes + 2 * max(longest, widest_rule) + 8
        self.initial_stack = (t.start,)

    def _prepare(self, names: list[tuple[str, ...]]) -> None:
        """Run now, in the compile, the string states the first masks of a schema's strings and keys
        would run, along the likely way they are written; the compile pays them, where no token is
        waiting (each would be a slow mask, the first time a schema reached it):

        - past the opening quote where each set of terminals starts a lexeme (a parser state's
          lookaheads): a string with a new pattern (a run over the vocabulary), and where a
          union of open objects opens, one key state that lexes all their names and extra keys (no
          base state: a whole run);
        - each key family's key states past the opening quote and past each token of a name's greedy
          tokenization (``TokenizerInfo.greedy_tokens``): the tokens that start with the names' next
          letters, run from there (``RunCache.lexrun_part``).

        At most ``PREPARED_STATES`` states a compile, and none past its deadline."""
        t, info = self.tables, self.info

        def quote(terms: frozenset[str]) -> int:  # the state past a lexeme's opening quote
            start = self._start(terms)[0]
            return SPACE.step(start, ord('"')) if start != DEAD else DEAD

        todo: list[int] = []
        for (w, members), family_names in zip(self._families, names):
            key = quote(frozenset((w, *members)))
            if key == DEAD:
                continue
            todo.append(key)
            for name in family_names:
                lex = key
                for tok in info.greedy_tokens(json.dumps(name, ensure_ascii=False)[1:-1].encode()):
                    for b in tok:
                        lex = SPACE.step(lex, b) if lex != DEAD else DEAD
                    if lex == DEAD:
                        break
                    todo.append(lex)
        sets = dict.fromkeys(
            frozenset(n for n in acts if n in t.terminals and n not in self.ignore) for acts in t.actions
        )
        todo += [q for terms in sets if terms and (q := quote(terms)) != DEAD]
        for lex in list(dict.fromkeys(todo))[:PREPARED_STATES]:
            if past_deadline():  # work the masks would do anyway: it never fails a compile
                break
            self.runs.prepare_state(lex)

    # -- parser contexts ---------------------------------------------------------------------------

    @property
    def n_states(self) -> int:
        return self.tables.n_states

    def context(self, stack: tuple[int, ...], after_ignore: bool) -> tuple[Context, int]:
        got = self._ctx.get(after_ignore, stack)
        if got is not None:
            return self._contexts[got[0]], len(stack) - got[1]
        t = self.tables
        terms = self._lookahead.get(stack[-1])
        if terms is None:
            terms = self._lookahead[stack[-1]] = tuple(
                n for n in t.actions[stack[-1]] if n in t.terminals and n not in self.ignore
            )
        names, lowest = shiftable(t, stack, terms)
        end_ok, low = accepts_end(t, stack)
        lowest = min(lowest, low)
        if names and not after_ignore and stack[-1] not in self.verbatim:
            names.extend(self.ignore)
        key = frozenset(names)
        at = self._lex0.get(key)
        if at is None:  # a new set of terminals: its start state, and its two contexts
            at = self._lex0[key] = len(self._contexts)
            lex0, drop = self._start(key)
            self._contexts += (Context(lex0, False, drop), Context(lex0, True, drop))
        at += end_ok
        lowest = max(lowest, 0)
        self._ctx.put(after_ignore, stack, lowest, (at, len(stack) - lowest))
        return self._contexts[at], lowest

    def _start(self, names: frozenset[str]) -> tuple[int, frozenset[int]]:
        """The lexer state that starts a lexeme of one of ``names``, and the DFAs it also lexes (the rest
        of a key family whose extra key is among ``names``: see ``_families``)."""
        t = self.tables

        def dfas(terms):
            return {t.terminals[n].dfa for n in terms if self.dfa_term.get(t.terminals[n].dfa) == n}

        own = dfas(names)
        if not own:
            return DEAD, frozenset()
        more = set().union(*(members - names for w, members in self._families if w in names))
        drop = frozenset(dfas(more) - own)
        return SPACE.start_state(own | drop), drop

    def _dropped(self, lex: int, run: LexRun, drop: frozenset[int]) -> np.ndarray:
        """The tokens of ``run`` (from ``lex``) consumed inside a lexeme that only the DFAs ``drop`` keep
        alive (cached per state and drop set)."""
        got = self._drop_bad.get((lex, drop))
        if got is None:
            ids, finals = run.inside_ids, run.inside_final
            if not any(d in drop for d, _ in SPACE.comps[lex]):  # then neither is any state after it
                ids = ids[:0]
            else:
                # A token that ends in a kept DFA's state alone is kept (an open object's extra key past
                # the names: most of them, a consecutive range of states); the others' final states are
                # read one by one (a family's tokens that keep a name alive: a few hundred).
                dom = SPACE.dominant(lex)
                if dom >= 0 and SPACE.comps[dom][0][0] not in drop:
                    lo, hi = SPACE.alone(SPACE.comps[dom][0][0])
                    other = (finals < lo) | (finals >= hi)
                    ids, finals = ids[other], finals[other]
                finals, where = np.unique(finals, return_inverse=True)
                comps = SPACE.comps
                bad = np.array([all(d in drop for d, _ in comps[q]) for q in finals.tolist()], dtype=bool)
                ids = ids[bad[where.reshape(-1)]]
            got = self._drop_bad[(lex, drop)] = ids
        return got

    def _keeps(self, stack: tuple[int, ...], lex: int) -> bool:
        """Whether state ``(stack, lex)`` inside a lexeme still has a terminal the parser takes (False only
        where a key family's extra names alone keep it alive)."""
        drop = self.context(stack, False)[0].drop
        return not drop or SPACE.is_start[lex] or not all(d in drop for d, _ in SPACE.comps[lex])

    def choose(self, lex: int) -> tuple[str, ...]:
        """The terminals an accepting lexer state stands for: Lark's first-ranked one, or (``glr``) every
        one; () if none."""
        got = self._choose.get(lex)
        if got is not None:
            return got
        names = sorted(
            {self.dfa_term[d] for d in SPACE.accepting[lex] if d in self.dfa_term}, key=self._rank.__getitem__
        )
        got = self._choose[lex] = tuple(names if self.glr else names[:1])
        return got

    def after_lexeme(self, stack: tuple[int, ...], lex: int) -> tuple[list[tuple[tuple[int, ...], int]], int]:
        """End the (accepting) lexeme in ``lex``. Returns ``([(stack', lex0'), ...], lowest)``: one pair
        per parse that goes on (none on failure); the lowest stack index read counts even on failure."""
        out: list[tuple[tuple[int, ...], int]] = []
        lowest = len(stack) - 1
        for term in self.choose(lex):
            if term in self.ignore:
                ctx, low = self.context(stack, True)
                lowest = min(lowest, low)
                if ctx.lex0 != DEAD:
                    out.append((stack, ctx.lex0))
                continue
            sts, low = push_all(self.tables, stack, term)
            lowest = min(lowest, low)
            for st in sts:
                ctx, low2 = self.context(st, False)
                lowest = min(lowest, low2)
                if ctx.lex0 != DEAD:
                    out.append((st, ctx.lex0))
        return (list(dict.fromkeys(out)) if len(out) > 1 else out), lowest

    def is_accepting(self, stack: tuple[int, ...], lex: int) -> tuple[bool, int]:
        if SPACE.is_start[lex] or lex == DEAD:
            ctx, low = self.context(stack, False)
            return ctx.end_ok, low
        lowest = len(stack) - 1
        for term in self.choose(lex):
            if term in self.ignore:
                if self.context(stack, False)[0].end_ok:
                    return True, lowest
                continue
            sts, low = push_all(self.tables, stack, term)
            lowest = min(lowest, low)
            for st in sts:
                ok, low2 = accepts_end(self.tables, st)
                lowest = min(lowest, low2)
                if ok:
                    return True, lowest
        return False, lowest

    # -- scalar stepping (advance) ------------------------------------------------------------------

    def feed(self, stack: tuple[int, ...], lex: int, data: bytes) -> list[tuple[tuple[int, ...], int]]:
        """Feed bytes; returns the states ``(stack, lex)`` they lead to: one for an LALR(1) grammar, any
        number where a general parse forks; none if they cannot continue the output."""
        step = SPACE.step
        accepting = SPACE.accepting
        cur = [(stack, lex)]
        for b in data:
            nxt = []
            for st, lx in cur:
                n = step(lx, b)
                if n != DEAD:
                    nxt.append((st, n))
                elif accepting[lx]:
                    for st2, lex0 in self.after_lexeme(st, lx)[0]:
                        n = step(lex0, b)
                        if n != DEAD:
                            nxt.append((st2, n))
            if len(nxt) > 1:
                nxt = list(dict.fromkeys(nxt))
                if len(nxt) > MAX_FORKS:
                    raise GrammarError(f"{self.source}: too ambiguous here (over {MAX_FORKS} parses)")
            elif not nxt:
                return nxt
            cur = nxt
        if self._families:
            cur = [(st, lx) for st, lx in cur if self._keeps(st, lx)]
        return cur

    def token_bytes(self, tid: int) -> bytes | None:
        if tid < len(self.info.token_bytes):
            b = self.info.token_bytes[tid]
            if b is not None:
                return b
        return self._token_bytes.get(tid)

    # -- masks ---------------------------------------------------------------------------------------

    def entry(self, stack: tuple[int, ...], lex: int) -> Entry:
        """The (cached) mask entry of state ``(stack, lex)``."""
        got = self._entries.get(lex, stack)
        if got is not None:
            hit = self._recent.get(id(got))
            if hit is not None and hit[0] is got:
                return hit[1]
            return self._keep_recent(got, Entry(torch.from_numpy(got[0]), *got))
        info, runs = self.info, self.runs
        lowest = len(stack) - 1
        base = SPACE.base(lex)
        if base is not None:
            # ``lex`` steps like ``base`` on all bytes but a few (inside an open object's key: the next
            # letters of the names it is a prefix of): its mask is base's (cached per position, and
            # its runs per grammar), but for the tokens that start with those bytes, run from ``lex``.
            e = self.entry(stack, base[0])
            lowest = min(lowest, len(stack) - e.depth)
            run, redo = runs.lexrun_part(lex, base[1])
            mask = e.mask.copy()
            mask[redo] = False
            mask[self._non_text] = False  # named special tokens and EOS: decided for ``lex`` below
        else:
            run = runs.lexrun(lex)
            mask = np.zeros(info.vocab_size, dtype=bool)
        mask[run.inside_ids] = True
        if self._families:  # the entry depends on the terminals the parser takes here
            ctx, low = self.context(stack, False)
            lowest = min(lowest, low)
            if ctx.drop:
                mask[self._dropped(lex, run, ctx.drop)] = False
        if SPACE.accepting[lex]:
            # Tokens whose first byte cannot continue the lexeme: it ends first, then they start anew.
            nxt, low = self.after_lexeme(stack, lex)
            lowest = min(lowest, low)
            if nxt:
                ends = runs.ends_first_mask(lex, run)
                for st2, lex0 in nxt:
                    e = self.entry(st2, lex0)
                    lowest = min(lowest, len(st2) - e.depth)
                    mask |= ends & e.mask
        for k, (pre, ids, offs) in enumerate(run.cross):
            ok, low = self._group_allowed(stack, pre, (run.key, k), ids, offs)
            lowest = min(lowest, low)
            mask[ok] = True
        for tid, data in self.named_special:
            if self.feed(stack, lex, data):
                mask[tid] = True
        accepting, low = self.is_accepting(stack, lex)
        lowest = min(lowest, low)
        only_eos = accepting and not mask.any()
        if accepting:
            mask[list(info.eos_ids)] = True
        if not mask.any():
            raise GrammarError(f"{self.source}: dead state (no token can continue); grammar bug?")
        tensor, view = runs.intern_mask(mask)
        e = Entry(tensor, view, accepting, only_eos, len(stack) - max(lowest, 0))
        # kept without the tensor (a tensor is tracked by the garbage collector; the array and the tuple
        # are not): a big schema's masks leave thousands of entries, which every full collection walked
        got = (view, accepting, only_eos, e.depth)
        self._entries.put(lex, stack, lowest, got)
        return self._keep_recent(got, e)

    def _keep_recent(self, got: tuple, e: Entry) -> Entry:
        if len(self._recent) >= RECENT_ENTRIES:
            self._recent.clear()
        self._recent[id(got)] = (got, e)  # ``got`` held too: its id cannot name another tuple meanwhile
        return e

    def _group_allowed(self, stack, pre: int, key: tuple, ids: np.ndarray, offs: np.ndarray):
        """Rows ``(ids, offs)`` whose lexeme ended in accepting ``pre``: which token ids can go on, and the
        lowest stack index read.

        Not cached here: the entry that asks is (per stack top read), and the rows' runs are (per rows
        and lexer state, ``rows_groups``). A cache per group and stack top nearly always misses (each
        object position that is new to the parser is new to its groups too), and its lookups and
        stores cost more than the few hits save."""
        nxt, lowest = self.after_lexeme(stack, pre)
        parts = [ids[:0]]
        for st2, lex0 in nxt:
            inside, subs = self.runs.rows_groups(key, lex0, ids, offs)
            parts.append(inside)
            for p, sub_ids, sub_offs, sub_key in subs:
                sub, low = self._group_allowed(st2, p, sub_key, sub_ids, sub_offs)
                lowest = min(lowest, low)
                parts.append(sub)
        ok = parts[-1] if len(parts) == 2 else np.unique(np.concatenate(parts))
        return ok, max(lowest, 0)

    # -- completion costs (budget steering) ----------------------------------------------------------

    def parser_cost(self, stack: tuple[int, ...]) -> int:
        if len(self._cp_memo) > 200_000:
            self._cp_memo.clear()
        return completion_cost(self.tables, stack, self._cp_memo)

    def lex_cost(self, stack: tuple[int, ...], lex: int) -> int:
        """Shortest completion in bytes from state ``(stack, lex)`` (INF if none)."""
        key = (lex, stack)
        got = self._cost_memo.get(key)
        if got is not None:
            return got
        if len(self._cost_memo) > 200_000:
            self._cost_memo.clear()
        if SPACE.is_start[lex] or lex == DEAD:
            best = self.parser_cost(stack)
        else:
            best = INF
            for d, s in SPACE.comps[lex]:
                term = self.dfa_term.get(d)
                if term is None:
                    continue
                dist = int(SPACE.dfas.dist[d][s])
                if term in self.ignore:
                    c = dist + self.parser_cost(stack)
                else:
                    sts, _ = push_all(self.tables, stack, term)
                    c = min((dist + self.parser_cost(st) for st in sts), default=INF)
                best = min(best, c)
        self._cost_memo[key] = best
        return best

    def max_next_cost(self, stack: tuple[int, ...], lex: int) -> int:
        """The largest cost among the states reachable by one allowed token (cached per state)."""
        key = ("max", lex, stack)
        got = self._cost_memo.get(key)
        if got is None:
            costs = token_costs(self, stack, lex)
            got = self._cost_memo[key] = int(costs.max()) if costs.size else -1
        return got

    def budget_mask(self, configs: tuple, remaining: int) -> torch.Tensor:
        """The mask under a token budget (see ``budget.budget_mask``); cached per states and limit."""
        key = (configs, remaining - 2)
        got = self._budget.get(key)
        if got is None:
            got = self._budget[key] = budget_mask(self, configs, remaining)
            if len(self._budget) > 512:
                self._budget.popitem(last=False)
        return got

    def union(self, configs: tuple) -> Entry:
        """The entry of several parser states at once (a forked parse): the union of their masks."""
        got = self._unions.get(configs)
        if got is None:
            entries = [self.entry(st, lx) for st, lx in configs]
            mask = np.logical_or.reduce([e.mask for e in entries])
            tensor, view = self.runs.intern_mask(mask)
            got = Entry(tensor, view, any(e.accepting for e in entries), all(e.only_eos for e in entries), 0)
            if len(self._unions) > 4096:
                self._unions.clear()
            self._unions[configs] = got
        return got

    # -- public ----------------------------------------------------------------------------------------

    def matcher(self) -> GrammarMatcher:
        """A fresh matcher at the start of the output."""
        return GrammarMatcher(self)

    def lark(self):
        """A Lark LALR parser for the same grammar text (for validating outputs in tests and tools)."""
        import lark

        return lark.Lark(self.text, parser="lalr", lexer="contextual", start=self.start)

    def stats(self) -> dict:
        return {
            "lalr_states": self.n_states,
            "conflicts": len(self.tables.forks),
            "mask_entries": len(self._entries),
            "lexer_states_cached": self.runs.cached_lexer_states,
        }


def read_grammar(source: str | Path) -> tuple[str, str]:
    """Resolve ``source`` to (text, name): Lark text itself, a path, or a file name in ``grammars/``."""
    if (
        isinstance(source, Path)
        or ("\n" not in source and source.endswith(".lark"))
        or ("\n" not in source and ":" not in source and " " not in source and "/" not in source)
    ):
        candidates = [Path(source)]
        name = Path(source).name if str(source).endswith(".lark") else f"{source}.lark"
        candidates += [d / name for d in _grammar_dirs()]
        for c in candidates:
            if c.is_file():
                return c.read_text(encoding="utf-8"), str(c.name)
        if isinstance(source, Path) or str(source).endswith(".lark"):
            raise GrammarError(f"grammar file not found: {source}")
    return str(source), "<grammar>"


def compile_grammar(
    source: str | Path,
    info: TokenizerInfo,
    *,
    start: str = "start",
    max_states: int = 20_000,
    glr: bool = False,
) -> CompiledGrammar:
    """Compile Lark grammar text, a ``.lark`` path, or the name of a file in ``grammars/``. Strict
    LALR(1) unless ``glr`` (then conflicts fork the parse: see ``CompiledGrammar``)."""
    text, name = read_grammar(source)
    return CompiledGrammar(text, info, source=name, start=start, max_states=max_states, glr=glr)
