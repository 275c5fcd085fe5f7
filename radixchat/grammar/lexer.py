"""The byte-level lexer shared by every grammar: lexer states and their vectorised token runs.

A *lexer state* is the set of terminals still alive in the current lexeme, each with its DFA state:
a canonical tuple ``((dfa_id, state), ...)``. Lexer states are interned process-wide in one
``LexerSpace`` and numbered (0 is the dead state), so a JSON string's interior is the same lexer state
in every JSON grammar, and what depends only on it is computed once per tokenizer (``LexRun``).

Stepping a lexer state by a byte steps each component DFA and keeps the live ones (a lazily built
product automaton). Rows of the product are kept in fixed-size int arrays (scalar stepping in ``advance``;
a state stepped on a byte or two needs no row: its components' moves are memoised) and in one numpy
table (vectorised runs of the whole vocabulary in ``run``).

What is kept per lexer state lives in a few flat arrays, not in an object per state: every container
object is one more thing each full collection of Python's garbage collector visits (an ``array`` is
tracked even though it holds no references), and a run over many schemas interns tens of thousands of
states. With one array per row and two per ``live_bytes`` entry a full collection took ~60 ms after 400
MaskBench schemas, and it landed inside some mask.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .counted import CountedDFA, compile_terminal
from .dfa import ByteDFA
from .errors import GrammarError

MAX_LEXER_STATES = 2_000_000
MAX_MOVES = 1_000_000  # ``LexerSpace._moves`` entries kept before it starts again
ROW_SHIFT = 16
ROW_CHUNK = 1 << ROW_SHIFT  # ints per array of ``LexerSpace._row_data`` (256 rows of 256)
DEAD = 0
_MIX = np.random.default_rng(0).integers(1, 1 << 40, size=4096) | 1  # column hashing in ``row``
FEW_STATES = 256  # a plain DFA of up to this many states has its ``_live_bits`` packed when it is made
TWIN_STATES = 64  # ``LexerSpace.canon`` compares the futures of states that reach at most this many
FEW_SHARED = 8  # ``row``: up to this many bytes that several components survive are interned one by one


class LexerSpace:
    """All terminal DFAs and all lexer states of this process (see module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: Every terminal DFA, by id (``DFAStore``: plain DFAs as arrays, out of the collector's sight).
        self.dfas = DFAStore()
        self._dfa_ids: dict[str, int] = {}
        # State s's components, flat: _comp_data[_comp_at[s]:_comp_at[s + 1]] is d0, s0, d1, s1, ...;
        # ``comps[s]`` rebuilds the tuple. The index maps their packed bytes to s: a dict of bytes to
        # ints is never tracked by the collector, where one keyed by tuples is re-tracked by each new
        # key and then walked, key by key, by every full collection.
        self._comp_at = array("q", [0, 0])
        self._comp_data = array("i")
        self.comps = _Comps(self)
        self._ids: dict[bytes, int] = {b"": DEAD}
        # Rows, built lazily, in int arrays of ROW_CHUNK ints each: state s's row starts at int
        # _row_at[s] (< 0: not built yet) of their concatenation. A few objects for the collector,
        # however many states; and no single array that grows: reallocating one of tens of MB (a
        # copy) took 30-80 ms inside one mask.
        self._row_at = array("q", [0])
        self._row_data: list[array] = [array("i", [DEAD] * 256)]
        # per state: the DFAs it accepts for (equal tuples shared, so a full collection walking the list
        # meets a few hot objects, not one per state) and whether every component is at its start
        self.accepting: list[tuple[int, ...]] = [()]
        self._acc_shared: dict[bytes, np.ndarray] = {b"": untracked(())}
        self.is_start: list[bool] = [False]
        # Rows materialised for vectorised runs (``materialise``), in the order they were needed: the
        # table grows with the states runs reach, not with every state interned (a counted string
        # interns a few per character it is given).
        self._table = np.zeros((1024, 256), dtype=np.int32)
        self._n_rows = 1  # row 0 is DEAD's
        self._slot = np.full(1024, -1, dtype=np.int32)  # lexer state -> its row in _table (-1: none yet)
        self._slot[DEAD] = 0
        self._acc_np = np.zeros(1024, dtype=bool)
        # ``live_bytes``: state -> the bytes that continue its lexeme (an untracked dict of bytes), read
        # from its components' live bytes (``_comp_live``: dfa << 32 | state -> a 256-bit int) where its
        # row is not built; where each byte leads is asked of ``step`` only for the bytes a walk takes.
        self._live_bytes: dict[int, bytes] = {}
        self._comp_live: dict[int, int] = {}
        self._single: dict[int, np.ndarray] = {}  # plain DFA id -> lexer state of each of its states + 1
        self._moves: dict[int, int] = {}  # ``step`` of states without a row: lex << 8 | byte -> next
        self._dominant: dict[int, int] = {}  # ``dominant``: lex -> its dominant component alone, or -1
        # Caches of ints and bytes only (a tuple in a long-lived dict has every full collection walk it:
        # see ``untracked``). ``base``: lex -> its state (-1: none) and bytes; ``_generic_of``:
        # dfa << 32 | state -> diff << 32 | generic state + 1; ``_row_diff``: dfa << 48 | s << 24 | t -> bits
        self._base_state: dict[int, int] = {}
        self._base_bytes: dict[int, bytes] = {}
        self._generic: dict[int, int] = {}
        self._row_diffs: dict[int, int] = {}
        # ``canon``: lex -> its twin; a future's code -> the first state seen with it, and its states in
        # the code's order; (twin, lex) -> ``twin_map``
        self._canon_of: dict[int, int] = {}
        self._canon_by_code: dict[bytes, int] = {}
        self._code_order: dict[int, np.ndarray] = {}
        self._twin_maps: dict[int, np.ndarray] = {}  # twin << 32 | other -> untracked(first, table)
        self._twin_root: dict[int, int] = {}  # lex -> the pair of states its twin was found by (as above)

    # -- DFAs --------------------------------------------------------------------------------------

    def dfa_id(self, pattern: str, where: str = "terminal") -> int:
        """Intern the DFA of a Python regex (counted where it can be: see ``counted``); equal patterns
        share one id."""
        got = self._dfa_ids.get(pattern)
        if got is not None:
            return got
        dfa = compile_terminal(pattern, where)
        with self.lock:
            got = self._dfa_ids.get(pattern)
            if got is None:
                got = self._dfa_ids[pattern] = self.dfas.append(dfa)
                if isinstance(dfa, ByteDFA) and dfa.n_states <= FEW_STATES:
                    self._pack_live(got)  # now, with the grammar's compile, not in its first masks
        return got

    # -- lexer states ------------------------------------------------------------------------------

    def intern(self, comps: tuple[tuple[int, int], ...]) -> int:
        flat = array("i", [x for c in comps for x in c])  # d0, s0, d1, s1, ...
        key = flat.tobytes()
        got = self._ids.get(key)
        if got is not None:
            return got
        if len(flat) == 2 and self.dfas.plain[flat[0]]:  # one plain DFA alone: numbered with its DFA
            return int(self._single_map(flat[0])[flat[1] + 1])
        with self.lock:
            got = self._ids.get(key)
            if got is not None:
                return got
            got = len(self.is_start)
            if got >= MAX_LEXER_STATES:
                raise GrammarError("too many lexer states (grammar terminals overlap too much)")
            self._comp_data.extend(flat)
            self._comp_at.append(len(self._comp_data))
            self._row_at.append(-1)
            dfas, states = flat[0::2], flat[1::2]
            accept = self.dfas.accept
            acc = array("i", [d for d, s in zip(dfas, states) if accept[d][s]])
            shared = self._acc_shared.get(acc.tobytes())
            if shared is None:
                shared = self._acc_shared[acc.tobytes()] = untracked(tuple(acc))
            self.accepting.append(shared[0])
            self.is_start.append(not any(states))
            self._grow_index()
            self._acc_np[got] = bool(acc)
            self._ids[key] = got
            return got

    def start_state(self, dfa_ids) -> int:
        """The lexer state at the start of a lexeme that may be any of these terminals."""
        return self.intern(tuple(sorted((d, 0) for d in set(dfa_ids))))

    def row(self, lex: int) -> array:
        """Next lexer state for each byte (DEAD where no terminal survives); a copy."""
        at = self._row_at[lex]
        if at >= 0:
            return self._row_of(at)
        comps = self.comps[lex]
        trans = self.dfas.trans
        if len(comps) == 1:  # one terminal (a string's interior): its DFA's row, renamed
            d, s = comps[0]
            if self.dfas.plain[d]:
                return self._single_row(lex, d, trans[d][s])
            targets, inv = np.unique(np.asarray(trans[d][s]), return_inverse=True)
            ids = [self.intern(((d, t),)) if t >= 0 else DEAD for t in targets.tolist()]
            return self._keep_row(lex, array("i", np.array(ids, dtype=np.int32)[inv.reshape(-1)].tobytes()))
        # Several terminals: each byte leads to the components it continues. The bytes each one lives on
        # are a 256-bit int (``_live_bits``, cached per component); a byte that one component alone
        # survives leads to its state alone, mapped a DFA at a time (``_single_ids``): in an open
        # object's key (the extra key, which takes any character, next to the declared names) that is
        # nearly every byte. Only the bytes several components survive intern a product state, one by
        # one where they are few. (A column per byte for every component, compared by hash, cost
        # ~100-400 us a row; a trie run from a key family's first state builds ~85 rows.)
        bits = [self._live_bits(d, s) for d, s in comps]
        seen = multi = 0
        for m in bits:
            multi |= seen & m
            seen |= m
        row = np.zeros(256, dtype=np.int32)  # DEAD
        if seen != multi:
            for (d, s), m in zip(comps, bits):
                solo = m & ~multi
                if solo:
                    idx = _bit_indexes(solo)
                    row[idx] = self._single_ids(d, np.asarray(trans[d][s])[idx])
        if multi.bit_count() > FEW_SHARED:  # many: their columns, equal ones found by a hash in a dict
            live = _bit_indexes(multi)
            sub = np.array([np.asarray(trans[d][s])[live] for d, s in comps], dtype=np.int64)
            h = ((sub + 1) * _MIX[np.arange(len(comps)) % _MIX.shape[0], None]).sum(axis=0).tolist()
            first: dict = {}
            rep = [first.setdefault(x, j) for j, x in enumerate(h)]  # each column's first equal one
            if not (sub[:, rep] == sub).all():  # a hash collision: compare whole columns
                first = {}
                rep = [first.setdefault(c, j) for j, c in enumerate(map(tuple, sub.T.tolist()))]
            ids = {}
            for j in first.values():
                col = sub[:, j].tolist()
                ids[j] = self.intern(tuple((d, t) for (d, _), t in zip(comps, col) if t >= 0))
            row[live] = [ids[j] for j in rep]
            multi = 0
        while multi:
            low = multi & -multi
            multi ^= low
            b = low.bit_length() - 1
            row[b] = self.intern(tuple((d, int(trans[d][s][b])) for (d, s), m in zip(comps, bits) if m & low))
        return self._keep_row(lex, array("i", row.tobytes()))

    def _keep_row(self, lex: int, row: array) -> array:
        with self.lock:
            if self._row_at[lex] < 0:  # another thread may have built it meanwhile
                last = self._row_data[-1]
                if len(last) >= ROW_CHUNK:
                    last = array("i")
                    self._row_data.append(last)
                self._row_at[lex] = (len(self._row_data) - 1) * ROW_CHUNK + len(last)
                last.extend(row)
        return row

    def _row_of(self, at: int) -> array:
        chunk, off = self._row_data[at >> ROW_SHIFT], at & (ROW_CHUNK - 1)
        return chunk[off : off + 256]

    def _single_row(self, lex: int, d: int, trans: np.ndarray) -> array:
        """``row`` of a one-terminal state of a plain DFA: its DFA row through the DFA's map from states
        to lexer states (``_single``; -1 where not interned yet), so no per-row ``unique``."""
        return self._keep_row(lex, array("i", self._single_ids(d, trans).tobytes()))

    def _single_ids(self, d: int, targets: np.ndarray) -> np.ndarray:
        """The lexer states of DFA ``d`` alone in each of its states ``targets`` (>= 0; interned where new)."""
        if not self.dfas.plain[d]:  # counted: no map of its states (there is no end to them)
            got = {t: self.intern(((d, t),)) for t in set(targets.tolist())}
            return np.array([got[t] for t in targets.tolist()], dtype=np.int32)
        return self._single_map(d)[targets + 1]

    def _single_map(self, d: int) -> np.ndarray:
        """Plain DFA ``d``'s states alone as lexer states, ``[DEAD, state of 0, state of 1, ...]``.

        They are all interned at once, as consecutive states, the first time any is asked for (a few
        array extensions, ~0.1 us a state): one by one they cost ~10 us each, and a walk of the vocabulary
        through a big DFA (a pattern under length bounds: ~20k states, one per count) met ~900 new ones
        in one mask. Not in ``_ids``: ``intern`` comes here for them."""
        m = self._single.get(d)
        if m is not None:
            return m
        with self.lock:
            m = self._single.get(d)
            if m is not None:
                return m
            n = int(self.dfas.trans[d].shape[0])
            base = len(self.is_start)
            if base + n > MAX_LEXER_STATES:
                raise GrammarError("too many lexer states (grammar terminals overlap too much)")
            flat = np.empty((n, 2), dtype=np.int32)
            flat[:, 0], flat[:, 1] = d, np.arange(n)
            self._comp_data.frombytes(flat.tobytes())
            self._comp_at.frombytes((self._comp_at[-1] + 2 * np.arange(1, n + 1, dtype=np.int64)).tobytes())
            self._row_at.frombytes(np.full(n, -1, dtype=np.int64).tobytes())
            acc = np.asarray(self.dfas.accept[d], dtype=bool)
            key = array("i", [d]).tobytes()
            one = self._acc_shared.get(key)
            if one is None:
                one = self._acc_shared[key] = untracked((d,))
            box = np.empty(2, dtype=object)
            box[0], box[1] = (), one[0]
            self.accepting.extend(box[acc.astype(np.intp)].tolist())
            self.is_start.append(True)
            self.is_start.extend([False] * (n - 1))
            self._grow_index()
            self._acc_np[base : base + n] = acc
            m = np.empty(n + 1, dtype=np.int32)
            m[0] = DEAD
            m[1:] = np.arange(base, base + n, dtype=np.int32)
            self._single[d] = m
        return m

    def alone(self, d: int) -> tuple[int, int]:
        """The lexer states of plain DFA ``d``'s states alone: ``range(lo, hi)`` (``_single_map``)."""
        m = self._single_map(d)
        return int(m[1]), int(m[1]) + m.shape[0] - 1

    def _single_state(self, d: int, t: int) -> int:
        """The lexer state of state ``t`` of plain DFA ``d`` alone."""
        return int(self._single_map(d)[t + 1])

    def live_bytes(self, lex: int) -> bytes:
        """The bytes that continue the lexeme of ``lex``, in order (cached). Where the state's row is not
        built they are the union of its components' live bytes: a walk down the vocabulary passes a
        product state per key prefix, and building its row (a column per byte, and a new state interned
        per distinct column) cost ~150-300 us where a few tokens continue through one or two bytes."""
        got = self._live_bytes.get(lex)
        if got is not None:
            return got
        at = self._row_at[lex]
        if at >= 0:
            got = np.flatnonzero(np.frombuffer(self._row_of(at), dtype=np.int32)).astype(np.uint8).tobytes()
        else:
            flat = self._comp_data[self._comp_at[lex] : self._comp_at[lex + 1]]
            bits = 0
            for d, s in zip(flat[::2], flat[1::2]):
                bits |= self._live_bits(d, s)
            got = _bytes_of(bits)
        self._live_bytes[lex] = got
        return got

    def dominant(self, lex: int) -> int:
        """For a product state of one wide component (more than ``WIDE`` live bytes) next to narrow ones:
        that component's state alone (whose trie runs ``trie_run`` derives this state's from: a key
        family's extra key next to the names it is not); else -1 (cached)."""
        got = self._dominant.get(lex)
        if got is not None:
            return got
        got = -1
        flat = self._comp_data[self._comp_at[lex] : self._comp_at[lex + 1]]
        if len(flat) > 2:
            wide = [(d, s) for d, s in zip(flat[::2], flat[1::2]) if self._live_bits(d, s).bit_count() > WIDE]
            if len(wide) == 1 and self.dfas.plain[wide[0][0]]:
                got = self._single_state(*wide[0])
        self._dominant[lex] = got
        return got

    def base(self, lex: int) -> tuple[int, bytes] | None:
        """A state that steps like ``lex`` on every byte but a few: ``(state, those bytes)``, or None
        (cached).

        ``lex`` must be a wide plain DFA's state (alone, or ``dominant`` next to narrow components) that
        is not accepting, and the base is that DFA's *generic* state alone: where most of the state's
        bytes lead. Inside an open object's key, the extra key (any string but a declared name) is in a
        state per prefix of a name, which differs from its state past every name only on that name's
        next letter; the generic state's runs over the vocabulary are kept, and a key position's masks
        are its masks but for the tokens that start with those few bytes (``CompiledGrammar.entry``),
        and its subtrees in a trie run are derived from the generic state's (``trie_run``)."""
        state = self._base_state.get(lex)
        if state is not None:
            return (state, self._base_bytes[lex]) if state >= 0 else None
        got = None
        flat = self._comp_data[self._comp_at[lex] : self._comp_at[lex + 1]]
        wide = None
        if len(flat) == 2:
            if self.dfas.plain[flat[0]]:
                wide, others = (flat[0], flat[1]), 0
        elif (dom := self.dominant(lex)) >= 0:
            wide, others = self.comps[dom][0], 0
            for d, s in zip(flat[::2], flat[1::2]):
                if d != wide[0]:
                    others |= self._live_bits(d, s)
        if wide is not None and not self._acc_np[lex]:
            g, diff = self._generic_of(wide[0], wide[1])
            if g >= 0 and (diff | others).bit_count() <= WIDE:
                state = self._single_state(wide[0], g)
                if not self._acc_np[state]:
                    got = (state, _bytes_of(diff | others))
        self._base_bytes[lex] = got[1] if got else b""
        self._base_state[lex] = got[0] if got else -1
        return got

    def _generic_of(self, d: int, s: int) -> tuple[int, int]:
        """State ``s`` of plain DFA ``d``'s generic state (where most of its live bytes lead; -1 if it is
        ``s`` itself or ``s`` is narrow) and the bytes on which the two step differently (cached)."""
        k = d << 32 | s
        got = self._generic.get(k)
        if got is None:
            row = np.asarray(self.dfas.trans[d][s])
            live = row[row >= 0]
            g = int(np.bincount(live).argmax()) if live.size > WIDE else -1
            got = self._generic[k] = (self._row_diff(d, s, g) << 32 | g + 1) if g not in (-1, s) else 0
        return (got & 0xFFFFFFFF) - 1, got >> 32

    def _row_diff(self, d: int, s: int, t: int) -> int:
        """The bytes on which states ``s`` and ``t`` of plain DFA ``d`` step differently (a 256-bit int)."""
        k = d << 48 | s << 24 | t
        got = self._row_diffs.get(k)
        if got is None:
            trans = self.dfas.trans[d]
            packed = np.packbits(np.asarray(trans[s]) != np.asarray(trans[t]), bitorder="little")
            got = self._row_diffs[k] = int.from_bytes(packed.tobytes(), "little")
        return got

    def canon(self, lex: int) -> int:
        """A state whose future is ``lex``'s, up to the names of states: its *twin* (``lex`` itself if
        none; cached). For one plain DFA's state alone that reaches at most ``TWIN_STATES``.

        Every open object's extra key is its own DFA (any string but its names), but past the names they
        all go on alike (a JSON string's interior): runs are kept by twin, and a twin's run is renamed
        (``twin_map``) instead of running the vocabulary again (~3-5 ms for each object's first key).
        The first state seen with a future is its twin, and so are the states it reaches for the states
        that a later one reaches (in the same place of their breadth-first orders)."""
        got = self._canon_of.get(lex)
        if got is not None:
            return got
        got = lex
        flat = self._comp_data[self._comp_at[lex] : self._comp_at[lex + 1]]
        if len(flat) == 2 and self.dfas.plain[flat[0]]:
            code, order = self._future_code(flat[0], flat[1])
            if code is not None:
                got = self._canon_by_code.setdefault(code, lex)
                ids = self._single_map(flat[0])[order + 1].tolist()
                self._code_order[lex] = order
                if got == lex:  # the first: the states it reaches are their own twins
                    for x in ids:
                        self._canon_of.setdefault(x, x)
                else:
                    twin = self._single_map(self.comps[got][0][0])[self._code_order[got] + 1].tolist()
                    for x, x0 in zip(ids, twin):
                        if x not in self._canon_of:
                            self._canon_of[x] = x0
                            self._twin_root[x] = got << 32 | lex
        self._canon_of[lex] = got
        self._twin_root.setdefault(lex, got << 32 | lex)
        return got

    def _future_code(self, d: int, s: int) -> tuple[bytes | None, np.ndarray]:
        """The states state ``s`` of plain DFA ``d`` reaches, in breadth-first order (bytes ascending),
        and a code of them: each one's row in their numbers, and whether it accepts (None past
        ``TWIN_STATES``). Two minimal DFAs' states have equal codes iff their futures are equal."""
        trans = np.asarray(self.dfas.trans[d])
        seen = np.zeros(trans.shape[0], dtype=bool)
        seen[s] = True
        order = [np.array([s], dtype=np.int64)]
        frontier, n = order[0], 1
        while frontier.size:
            t = trans[frontier].ravel()
            t = t[t >= 0]
            t = t[~seen[t]]
            if not t.size:
                break
            _, at = np.unique(t, return_index=True)
            frontier = t[np.sort(at)].astype(np.int64)  # new states, in the order they are first met
            n += frontier.size
            if n > TWIN_STATES:
                return None, frontier
            seen[frontier] = True
            order.append(frontier)
        states = np.concatenate(order)
        num = np.full(trans.shape[0] + 1, -1, dtype=np.int16)
        num[states] = np.arange(states.size)
        rows = num[trans[states]]  # -1 (dead) reads num's last slot: -1
        return rows.tobytes() + np.asarray(self.dfas.accept[d], dtype=bool)[states].tobytes(), states

    def twin_map(self, lex: int) -> tuple[int, np.ndarray]:
        """``(first, table)``: state ``x`` of the runs of ``lex``'s twin (DEAD, or a state of its DFA
        alone that it reaches) is ``lex``'s state ``table[x - first + 1]`` (``table[0]`` is DEAD)."""
        root = self._twin_root[lex]
        got = self._twin_maps.get(root)
        if got is None:
            twin, other = root >> 32, root & 0xFFFFFFFF
            (d0, _), (d1, _) = self.comps[twin][0], self.comps[other][0]
            first = int(self._single_map(d0)[1])
            table = np.full(self.dfas.trans[d0].shape[0] + 1, DEAD, dtype=np.int32)
            table[self._code_order[twin] + 1] = self._single_map(d1)[self._code_order[other] + 1]
            got = self._twin_maps[root] = untracked(first, table)
        return got[0], got[1]

    def derive_base(self, lex: int) -> int:
        """The state whose trie runs ``trie_run`` derives ``lex``'s from (``lex`` differs from it on few
        bytes: ``diff_bits``): its ``base``, or its dominant component's, or that component alone; -1 if
        none."""
        dom = self.dominant(lex)
        b = self.base(dom if dom >= 0 else lex)
        return b[0] if b is not None else dom

    def diff_bits(self, s: int, t: int) -> int:
        """The bytes on which lexer states ``s`` and ``t`` (DEAD, or one plain DFA's state alone) may step
        to different states, as a 256-bit int."""
        if s == t:
            return 0
        flat = self._comp_data[self._comp_at[s] : self._comp_at[s + 1]]
        if t == DEAD:
            bits = 0
            for d, x in zip(flat[::2], flat[1::2]):
                bits |= self._live_bits(d, x)
            return bits
        ((d0, g),) = self.comps[t]
        bits, own = 0, -1
        for d, x in zip(flat[::2], flat[1::2]):
            if d == d0:
                own = x
            else:
                bits |= self._live_bits(d, x)
        if own < 0:  # lost it (a declared name's closing quote, which the extra key does not take)
            return bits | self._live_bits(d0, g)
        return bits | self._row_diff(d0, own, g)

    def walkable(self, lex: int) -> bool:
        """Whether ``lex`` is run by a walk of the vocabulary (``walk_run``), not vectorised: few bytes
        continue its lexeme, or many but each terminal takes few (a closed object's first key state:
        a hundred names, ~20 first letters between them, one each). A vectorised run from there built
        a row of the product for every name prefix a token reached (~270 rows, 20-35 ms); the walk
        steps only the bytes tokens take."""
        if len(self.live_bytes(lex)) <= WIDE:
            return True
        flat = self._comp_data[self._comp_at[lex] : self._comp_at[lex + 1]]
        return all(self._live_bits(d, s).bit_count() <= WIDE for d, s in zip(flat[::2], flat[1::2]))

    def _live_bits(self, d: int, s: int) -> int:
        """The bytes state ``s`` of DFA ``d`` continues on, as a 256-bit int (bit b: byte b; cached)."""
        k = d << 32 | s
        m = self._comp_live.get(k)
        if m is None:  # a big or counted DFA's state (a small plain DFA's are packed by ``dfa_id``)
            packed = np.packbits(np.asarray(self.dfas.trans[d][s]) >= 0, bitorder="little")
            m = self._comp_live[k] = int.from_bytes(packed.tobytes(), "little")
        return m

    def _pack_live(self, d: int) -> None:
        """``_live_bits`` of every state of plain DFA ``d`` (~30 us for a name's DFA: a closed object's
        first key state has a hundred of them, and packing them there cost its mask ~8 ms)."""
        trans = self.dfas.trans[d]
        packed = np.packbits(trans >= 0, axis=1, bitorder="little").tobytes()
        for t in range(trans.shape[0]):
            self._comp_live[d << 32 | t] = int.from_bytes(packed[32 * t : 32 * t + 32], "little")

    def step(self, lex: int, byte: int) -> int:
        at = self._row_at[lex]
        if at >= 0:
            return self._row_data[at >> ROW_SHIFT][(at & (ROW_CHUNK - 1)) + byte]
        key = lex << 8 | byte
        got = self._moves.get(key)
        if got is None:
            got = self._move(lex, byte)
            if len(self._moves) >= MAX_MOVES:
                self._moves.clear()
            self._moves[key] = got
        return got

    def cont(self, lex: int) -> np.ndarray:
        """bool[256]: the bytes that continue the lexeme of ``lex`` (some component lives on): its
        ``live_bytes`` as a mask, so no row is built for it (a run's ``cont`` built one per lexer state
        it started from)."""
        live = np.zeros(256, dtype=bool)
        live[np.frombuffer(self.live_bytes(lex), dtype=np.uint8)] = True
        return live

    def _move(self, lex: int, byte: int) -> int:
        """``step`` of a state whose row is not built, from its components' moves on ``byte`` alone: a
        scalar run (a few tokens after a lexeme ended, a token's bytes through a key it alone passes)
        steps a state on one or two bytes, and a row of 256 costs ~50-150 us where several terminals
        are alive (a lexeme's start)."""
        flat = self._comp_data[self._comp_at[lex] : self._comp_at[lex + 1]]
        out = []
        trans = self.dfas.trans
        pairs = zip(flat[::2], flat[1::2])
        if len(flat) > 16:  # many terminals (an object's names): only those living on ``byte`` are read
            live = self._comp_live
            pairs = [(d, s) for d, s in pairs if (live.get(d << 32 | s) or self._live_bits(d, s)) >> byte & 1]
        for d, s in pairs:
            t = int(trans[d][s][byte])
            if t >= 0:
                out.append((d, t))
        if not out:
            return DEAD
        if len(out) == 1 and self.dfas.plain[out[0][0]]:
            return self._single_state(*out[0])
        return self.intern(tuple(out))

    def materialise(self, states: np.ndarray) -> None:
        """Make the rows of ``states`` ready for ``next_states`` (lazily: a
        vocabulary run pays only for the lexer states its tokens reach, never for a DFA's closure)."""
        if len(self.is_start) <= self._slot.shape[0] and (self._slot[states] >= 0).all():
            return
        with self.lock:
            self._grow_index()
            need = np.unique(states[self._slot[states] < 0]).tolist()
            rows = [self.row(s) for s in need]  # may intern new states: grow again before writing
            self._grow_index()
            n = self._n_rows + len(need)
            if n > self._table.shape[0]:
                table = np.zeros((max(n, 2 * self._table.shape[0]), 256), dtype=np.int32)
                table[: self._n_rows] = self._table[: self._n_rows]
                self._table = table
            for s, r in zip(need, rows):
                self._table[self._n_rows] = r
                self._slot[s] = self._n_rows
                self._n_rows += 1

    def next_states(self, states: np.ndarray, data: np.ndarray) -> np.ndarray:
        """The lexer state after byte ``data[i]`` from ``states[i]``, for every i (vectorised)."""
        self.materialise(states)
        return self._table[self._slot[states], data]

    def _grow_index(self) -> None:
        n = len(self.is_start)
        if n <= self._slot.shape[0]:
            return
        cap = max(n, 2 * self._slot.shape[0])
        slot = np.full(cap, -1, dtype=np.int32)
        slot[: self._slot.shape[0]] = self._slot
        acc = np.zeros(cap, dtype=bool)
        acc[: self._acc_np.shape[0]] = self._acc_np
        self._slot, self._acc_np = slot, acc

    @property
    def accepting_np(self) -> np.ndarray:
        """bool per lexer state: whether it accepts (set when the state is interned)."""
        return self._acc_np

    def describe(self, lex: int) -> tuple:
        """A process-independent name of a lexer state (for persisted caches): ``(pattern, state)`` per
        component, where a counted DFA's state is its ``[skeleton state, count]``."""
        return tuple((self.dfas.pattern[d], _state_key(self.dfas[d], s)) for d, s in self.comps[lex])

    def state_of(self, pattern: str, key) -> tuple[int, int]:
        """The component ``(dfa id, state)`` that ``describe`` named ``(pattern, key)``."""
        d = self.dfa_id(pattern)
        dfa = self.dfas[d]
        return d, (dfa.state_of(key) if isinstance(dfa, CountedDFA) else int(key))


class DFAStore:
    """The terminal DFAs of the lexer space, by id. A plain DFA is kept as its arrays (transitions,
    accepting states, distances, pattern) in numpy object arrays, which the garbage collector neither
    tracks nor walks; ``store[d]`` rebuilds a ``ByteDFA`` over them. A ByteDFA object per DFA was the
    largest thing left in each full collection (~4k objects, 24k references after 400 MaskBench schemas).
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


def _bytes_of(bits: int) -> bytes:
    """The set bits of a 256-bit int, ascending, as bytes (cached: the same sets come back)."""
    got = _BYTES_OF.get(bits)
    if got is None:
        out = bytearray()
        b = bits
        while b:
            low = b & -b
            out.append(low.bit_length() - 1)
            b ^= low
        if len(_BYTES_OF) >= 1 << 16:
            _BYTES_OF.clear()
        got = _BYTES_OF[bits] = bytes(out)
    return got


_BYTES_OF: dict[int, bytes] = {}


def _bit_indexes(bits: int) -> np.ndarray:
    """The positions of the set bits of a 256-bit int, ascending."""
    return np.flatnonzero(
        np.unpackbits(np.frombuffer(bits.to_bytes(32, "little"), dtype=np.uint8), bitorder="little")
    )


def untracked(*values) -> np.ndarray:
    """``values`` in a numpy object array: a container the garbage collector neither tracks nor walks.

    For the values of long-lived caches: a dict whose keys and values are all untracked is itself
    untracked, but one new tuple value (tuples start out tracked) makes it tracked again, and a full
    collection then walks every entry (two caches of ~27k entries took ~100k of the ~230k visits of a
    full collection after a MaskBench run). Only for values that cannot lead back to the box (no cycle
    through it can exist, so the collector missing it frees nothing late)."""
    box = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        box[i] = v
    return box


class _Comps:
    """``LexerSpace.comps``: a read-only sequence view of the states' components (a fresh tuple each
    time: they are stored flat)."""

    __slots__ = ("_space",)

    def __init__(self, space: LexerSpace) -> None:
        self._space = space

    def __len__(self) -> int:
        return len(self._space.is_start)

    def __getitem__(self, lex: int) -> tuple[tuple[int, int], ...]:
        sp = self._space
        flat = sp._comp_data[sp._comp_at[lex] : sp._comp_at[lex + 1]]
        return tuple(zip(flat[::2], flat[1::2]))


def _state_key(dfa: ByteDFA | CountedDFA, s: int):
    return dfa.state_key(s) if isinstance(dfa, CountedDFA) else s


SPACE = LexerSpace()


@dataclass(slots=True)
class LexRun:
    """What one lexer state does to every text token of one tokenizer (context-independent).

    - ``inside_ids``: tokens consumed entirely inside the current lexeme; ``inside_final[i]`` is the
      lexer state after ``inside_ids[i]``;
    - ``cont``: bool[256], bytes that continue the current lexeme. A token whose first byte is not in it
      ends the lexeme before its first byte (possible only if the state is accepting);
    - ``cross``: tokens that end the lexeme after their first byte: ``(pre_state, ids, offsets)``, where
      the lexeme ends in accepting ``pre_state`` and the token's bytes from ``offset`` on remain;
    - ``key``: names the rows of ``cross`` (``key, k`` fix the k-th group's pre state and rows, so caches
      of what follows them can be shared); ``("x", lex)`` unless runs of several states share groups;
    - ``finals``: ``inside_final``, or a function computing it when first asked (counted runs: only
      budget steering and the disk cache read it). Such runs are cheap to derive and not persisted.
    """

    inside_ids: np.ndarray
    finals: np.ndarray | Callable[[], np.ndarray]
    cont: np.ndarray
    cross: tuple[tuple[int, np.ndarray, np.ndarray], ...]
    key: tuple = ()

    def __post_init__(self) -> None:
        # a tuple of tuples of ints and arrays: untracked by the collector (a list would be walked in
        # every full collection, one per run kept)
        self.cross = tuple(self.cross)

    @property
    def inside_final(self) -> np.ndarray:
        f = self.finals
        if callable(f):
            f = self.finals = f()
        return f

    @property
    def derived(self) -> bool:
        return self.key[:1] == ("xc",)


def run(
    lex: int, ids: np.ndarray, offs: np.ndarray, flat: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the bytes ``flat[starts[id] + off:]`` of each row from lexer state ``lex``, vectorised.

    Returns ``(final, death, pre)``: ``final`` is the lexer state after the whole row (DEAD if the lexeme
    died first); for rows that died, ``death`` is the offset of the byte that could not be consumed
    and ``pre`` the lexer state before it (``death`` is -1 for rows that did not die).
    """
    n = ids.shape[0]
    if n <= SCALAR_ROWS:
        return _run_scalar(lex, ids, offs, flat, starts, lens)
    final = np.zeros(n, dtype=np.int32)
    death = np.full(n, -1, dtype=np.int32)
    pre = np.zeros(n, dtype=np.int32)
    rows = np.arange(n)
    cur = np.full(n, lex, dtype=np.int32)
    pos = offs.astype(np.int64)
    base = starts[ids].astype(np.int64)
    end = lens[ids].astype(np.int64)
    done = pos >= end
    if done.any():
        final[rows[done]] = lex
        keep = ~done
        rows, cur, pos, base, end = rows[keep], cur[keep], pos[keep], base[keep], end[keep]
    while rows.size:
        nxt = SPACE.next_states(cur, flat[base + pos])
        dead = nxt == DEAD
        if dead.any():
            r = rows[dead]
            death[r] = pos[dead]
            pre[r] = cur[dead]
            keep = ~dead
            rows, nxt, pos, base, end = rows[keep], nxt[keep], pos[keep], base[keep], end[keep]
        pos = pos + 1
        cur = nxt
        done = pos >= end
        if done.any():
            final[rows[done]] = cur[done]
            keep = ~done
            rows, cur, pos, base, end = rows[keep], cur[keep], pos[keep], base[keep], end[keep]
    return final, death, pre


SCALAR_ROWS = 48  # below this many rows, a Python loop beats numpy's per-call overhead


def _run_scalar(
    lex: int, ids: np.ndarray, offs: np.ndarray, flat: np.ndarray, starts: np.ndarray, lens: np.ndarray
):
    """``run`` for a few rows, one byte at a time in Python."""
    got = [
        _run_bytes(lex, flat[a : a + z].tobytes(), o)
        for a, o, z in zip(starts[ids].tolist(), offs.tolist(), lens[ids].tolist())
    ]
    out = np.array(got, dtype=np.int32).reshape(-1, 3)
    return out[:, 0].copy(), out[:, 1].copy(), out[:, 2].copy()


def _run_bytes(lex: int, tok: bytes, d: int) -> tuple[int, int, int]:
    """``run`` of one token's bytes from offset ``d`` on, from ``lex``: (final, death, pre)."""
    step = SPACE.step
    cur = lex
    for o in range(d, len(tok)):
        nxt = step(cur, tok[o])
        if nxt == DEAD:
            return DEAD, o, cur
        cur = nxt
    return cur, -1, 0


class Trie:
    """The vocabulary as a trie of its distinct prefixes, level by level (one level per byte), for
    ``trie_run``: a run of the whole vocabulary steps each distinct prefix once (SmolLM2: 100k prefixes
    for 332k token bytes) with one vectorised step per level.

    Level ``d`` (0-based; prefixes of ``d + 1`` bytes) holds ``byte[d]`` (each prefix's last byte),
    ``parent[d]`` (its prefix's index in level ``d - 1``); ``node`` is the global index of each token's
    own prefix (levels concatenated; ``off[d]`` is where level ``d`` starts); ``ids`` the token ids in
    the order of ``node``. The tokens that start with level-0 node ``i``'s byte are ``first[i]`` to
    ``first[i + 1]`` (the vocabulary is sorted), and its subtree holds ``span[d][i]`` to
    ``span[d][i + 1]`` of level ``d``; ``memo`` keeps runs of those subtrees (see ``trie_run``)."""

    __slots__ = (
        "byte",
        "parent",
        "off",
        "node",
        "ids",
        "toks",
        "first",
        "span",
        "memo",
        "memo_size",
        "lock",
        "dead",
    )

    # tokens' runs kept in ``memo`` (12 bytes each); past it the least recently used subtrees go, a few at
    # a time (clearing it all at once freed ~80 runs' arrays inside one mask: ~13 ms)
    MEMO_TOKENS = 4_000_000

    def __init__(self, toks: list[bytes], ids: np.ndarray) -> None:
        n = len(toks)
        lens = np.array([len(t) for t in toks], dtype=np.int64)
        width = int(lens.max()) if n else 0
        mat = np.full((n, width), -1, dtype=np.int16)  # -1 past a token's end: differs from any byte
        buf = np.frombuffer(b"".join(toks), dtype=np.uint8)
        rows = np.repeat(np.arange(n), lens)
        cols = np.arange(buf.size) - np.repeat(np.cumsum(lens) - lens, lens)
        mat[rows, cols] = buf
        # toks is sorted: the tokens sharing a prefix are contiguous, so a prefix of d bytes starts a
        # new node at token i iff i is long enough and shares fewer than d bytes with token i - 1.
        lcp = np.zeros(n, dtype=np.int64)
        if n > 1:
            neq = mat[1:] != mat[:-1]
            lcp[1:] = np.where(neq.any(axis=1), neq.argmax(axis=1), width)
        self.byte: list[np.ndarray] = []
        self.parent: list[np.ndarray] = []
        self.off = [0]
        node = np.zeros(n, dtype=np.int64)
        prev = None
        for d in range(width):
            first = np.flatnonzero((lens > d) & (lcp <= d))
            self.byte.append(mat[first, d].astype(np.uint8))
            self.parent.append(
                np.searchsorted(prev, first, side="right") - 1 if prev is not None else np.zeros(0, np.int64)
            )
            ends = np.flatnonzero(lens == d + 1)
            node[ends] = self.off[-1] + np.searchsorted(first, ends, side="right") - 1
            self.off.append(self.off[-1] + first.size)
            prev = first
        self.node = node
        self.ids = ids
        self.toks = toks  # the tokenizer's own sorted list (``_derive``'s walks bisect it)
        roots = self.byte[0] if width else np.zeros(0, np.uint8)  # tokens are never empty
        self.first = (
            np.r_[np.searchsorted(mat[:, 0], roots.astype(np.int16)), n] if n else np.zeros(1, np.int64)
        )
        self.span = [np.arange(roots.size + 1)] if width else []
        for d in range(1, width):  # a level's nodes are in token order: each subtree's are contiguous
            self.span.append(np.searchsorted(self.parent[d], self.span[-1]))
        # (state << 8 | first byte) -> untracked(final, death, pre): ints and boxes only (``untracked``)
        self.memo: dict[int, np.ndarray] = {}
        self.memo_size = 0
        self.lock = threading.Lock()
        self.dead = np.zeros(int(np.diff(self.first).max()) if n else 0, np.int32)  # DEAD (0), read-only


def trie_run(
    lex: int, trie: Trie, sel: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``run`` of every token of ``trie`` from the start of their bytes (in the order of ``trie.ids``),
    one distinct prefix at a time; with ``sel`` (level-0 node indices, ascending), of the tokens of
    those subtrees only (``trie.first[i]`` to ``trie.first[i + 1]`` for each, concatenated).

    A token's run after its first byte depends only on the lexer state that byte leads to, so the runs
    of each first byte's subtree are kept by (byte, state): the states inside an open object's key, say,
    differ from the plain string state in the few bytes that continue a declared name, and reuse every
    other subtree (stepping only the subtrees not seen before: a few hundred tokens, not all ~49k).
    A subtree whose state differs from another's on a few bytes only (``LexerSpace.derive_base``) is
    run from that one and derived (``_derive``)."""
    if not trie.byte:
        empty = np.zeros(0, dtype=np.int32)
        return empty, empty, empty
    if sel is None:
        nodes = np.arange(trie.byte[0].size)
        roots = trie.byte[0]
        after = SPACE.next_states(np.full(roots.size, lex, dtype=np.int32), roots)
    else:  # a few first bytes: stepped one by one (a product state's row costs ~100 us)
        nodes = np.asarray(sel, dtype=np.int64)
        roots = trie.byte[0][nodes]
        after = np.array([SPACE.step(lex, b) for b in roots.tolist()], dtype=np.int32)
    live = np.flatnonzero(after != DEAD).tolist()
    derive = {}  # index in nodes -> the state its subtree is derived for (``_derive``)
    twins: dict[int, list[int]] = {}  # state -> indexes in nodes whose runs are its twin's, renamed
    start_at = after.copy()  # the states runs start from: a twin's, where the memo keeps it
    plan: dict[int, tuple[int, int]] = {}  # state -> (its derivation base or -1, the twin run from)
    for i in live:
        a = int(after[i])
        got = plan.get(a)
        if got is None:
            b = SPACE.derive_base(a)
            got = plan[a] = (b, SPACE.canon(b if b >= 0 else a))
        b, c = got
        if b >= 0:
            derive[i] = a
            after[i] = a = b
        if c != a:
            twins.setdefault(a, []).append(i)
        start_at[i] = c
    keys = (start_at.astype(np.int64) << 8 | roots).tolist()
    found = {keys[i]: trie.memo.get(keys[i]) for i in live}  # held here: the memo may evict them meanwhile
    todo = [i for i in live if found[keys[i]] is None]
    _touch(trie, [k for k, v in found.items() if v is not None])
    sizes = np.diff(trie.first)[nodes]
    starts = np.cumsum(sizes) - sizes  # where each subtree's tokens start in the output
    if sel is None and 2 * len(todo) > len(live):  # mostly new: one run of the whole trie, kept by subtree
        final, death, pre = _levels(trie, nodes, start_at)
        _remember(
            trie, [keys[i] for i in live], sizes[live].tolist(), starts[live].tolist(), (final, death, pre)
        )
    else:
        if todo:
            sub = np.array(todo, dtype=np.int64)
            at = np.cumsum(sizes[sub]) - sizes[sub]
            out = _levels(trie, nodes[sub], start_at[sub])
            found.update(_remember(trie, [keys[i] for i in todo], sizes[sub].tolist(), at.tolist(), out))
        dead = trie.dead
        parts = [
            found[key] if a != DEAD else (dead[:k],) * 3
            for key, a, k in zip(keys, after.tolist(), sizes.tolist())
        ]
        if parts:
            final, death, pre = (np.concatenate([p[j] for p in parts]) for j in range(3))
        else:
            final = death = pre = np.zeros(0, dtype=np.int32)
    first_dies = np.repeat(after == DEAD, sizes)  # tokens whose first byte ends the lexeme (no subtree kept)
    if derive or twins:
        final, death, pre = final.copy(), death.copy(), pre.copy()  # they may be the memo's views
    for a, idx in twins.items():  # a twin's states renamed
        first, table = SPACE.twin_map(a)
        sub = np.array(idx, dtype=np.int64)
        pos = concat_ranges(starts[sub], starts[sub] + sizes[sub])
        for arr in (final, pre):
            x = arr[pos]
            arr[pos] = table[np.where(x == DEAD, 0, x - first + 1)]
    if derive:
        for i, a in derive.items():
            lo = int(trie.first[nodes[i]])
            _derive(trie, a, int(after[i]), lo, lo + int(sizes[i]), final, death, pre, lo - int(starts[i]))
    death[first_dies], pre[first_dies] = 0, lex
    return final, death, pre


def _derive(
    trie: Trie,
    lex: int,
    base: int,
    lo: int,
    hi: int,
    final: np.ndarray,
    death: np.ndarray,
    pre: np.ndarray,
    shift: int = 0,
) -> None:
    """Turn the runs of tokens ``lo:hi`` (one first byte's subtree; at ``lo - shift`` in the arrays)
    after their first byte from lexer state ``base`` into their runs from ``lex``, in place.

    The two states step alike on all bytes but a few (``LexerSpace.diff_bits``: a key family's names'
    next letters), and so do the states they lead to on every other byte: a token's run differs only
    where it ends or dies while the states differ. A walk down the sorted vocabulary follows just the
    bytes they differ on, and writes the tokens it meets; every other token keeps the run it has.
    (The subtree of a name's first letter in a key family stepped product states, a row each: ~60 rows
    of ~100 us.)"""
    toks = trie.toks
    todo = [(lex, base, 1, lo, hi)]
    while todo:
        s, sb, d, lo, hi = todo.pop()
        if s == sb:
            continue
        p = toks[lo][:d]
        a, z = lo - shift, hi - shift
        if len(toks[lo]) == d:  # the token that is exactly this prefix (sorted first)
            final[a], death[a], pre[a] = s, -1, 0
            lo, a = lo + 1, a + 1
            if lo >= hi:
                continue
        bits = SPACE.diff_bits(s, sb)
        if bits.bit_count() > WIDE:  # not narrow: these tokens one byte at a time
            for k in range(lo, hi):
                final[k - shift], death[k - shift], pre[k - shift] = _run_bytes(s, toks[k], d)
            continue
        if sb == DEAD:  # the base died before: they die here, but on the bytes walked below
            final[a:z], death[a:z], pre[a:z] = DEAD, d, s
        else:  # those that die here from the base on a byte the states step alike on die after ``s``
            for k in (a + np.flatnonzero(death[a:z] == d)).tolist():
                if not bits >> toks[k + shift][d] & 1:
                    pre[k] = s
        for b in _bytes_of(bits):
            pb = p + _BYTE[b]
            x = bisect_left(toks, pb, lo, hi)
            y = bisect_left(toks, p + _BYTE[b + 1], x, hi) if b < 255 else hi
            if x >= y:
                continue
            ns = SPACE.step(s, b)
            if ns == DEAD:
                u, v = x - shift, y - shift
                final[u:v], death[u:v], pre[u:v] = DEAD, d, s
            else:
                todo.append((ns, SPACE.step(sb, b) if sb != DEAD else DEAD, d + 1, x, y))


def _levels(trie: Trie, roots: np.ndarray, states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step the subtrees of level-0 nodes ``roots`` (sorted) one level at a time, vectorised, from
    ``states``, the lexer states after their first byte. Returns ``(final, death, pre)`` of the tokens
    of those subtrees, in order (of every token when ``roots`` are all the level-0 nodes; a subtree
    from DEAD reads as never dying: the caller says where its tokens died)."""
    n = trie.off[-1]
    out_states = np.empty(n, dtype=np.int32)  # only the subtrees' nodes are written, and read
    out_deaths = np.empty(n, dtype=np.int32)
    out_pres = np.empty(n, dtype=np.int32)
    ps = states.astype(np.int32)
    pd = np.full(roots.size, -1, dtype=np.int32)
    pp = np.zeros(roots.size, dtype=np.int32)
    out_states[roots], out_deaths[roots], out_pres[roots] = ps, pd, pp
    idx, whole = roots, roots.size == trie.byte[0].size
    for d in range(1, len(trie.byte)):
        if whole:
            nxt, at = None, trie.parent[d]
        else:
            nxt = concat_ranges(trie.span[d][roots], trie.span[d][roots + 1])  # the subtrees' level-d nodes
            if not nxt.size:
                break
            at = np.searchsorted(idx, trie.parent[d][nxt])  # each node's parent among the last level's
        ps, pd, pp = ps[at], pd[at], pp[at]
        data = trie.byte[d] if nxt is None else trie.byte[d][nxt]
        live = ps != DEAD
        n_live = int(np.count_nonzero(live))
        if 4 * n_live >= ps.size:
            cur = SPACE.next_states(ps, data)
        else:  # most of the level's parents died already (a key, a number): step only the others
            cur = np.zeros_like(ps)  # DEAD
            if n_live:
                sel = np.flatnonzero(live)
                cur[sel] = SPACE.next_states(ps[sel], data[sel])
        died = (cur == DEAD) & live
        if died.any():
            pd = np.where(died, d, pd).astype(np.int32)
            pp = np.where(died, ps, pp).astype(np.int32)
        g = slice(trie.off[d], trie.off[d + 1]) if nxt is None else trie.off[d] + nxt
        out_states[g], out_deaths[g], out_pres[g] = cur, pd, pp
        idx, ps = nxt, cur
    node = trie.node if whole else trie.node[concat_ranges(trie.first[roots], trie.first[roots + 1])]
    return out_states[node], out_deaths[node], out_pres[node]


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``lo[i]`` to ``hi[i]``, concatenated."""
    sizes = hi - lo
    return np.arange(int(sizes.sum())) + np.repeat(lo - (np.cumsum(sizes) - sizes), sizes)


def _remember(trie: Trie, keys: list, sizes: list[int], at: list[int], out: tuple[np.ndarray, ...]) -> dict:
    """Keep the runs of level-0 subtrees by ``keys`` (state << 8 | first byte): each the ``sizes[i]``
    tokens at ``at[i]`` of ``out``, as read-only views in an ``untracked`` box; returns them."""
    final, death, pre = out
    got = {}
    with trie.lock:
        for key, k, a in zip(keys, sizes, at):
            got[key] = run = untracked(final[a : a + k], death[a : a + k], pre[a : a + k])
            if k > Trie.MEMO_TOKENS:
                continue  # never kept: the memo stays within its bound
            memo = trie.memo
            old = memo.pop(key, None)  # another thread's run of the same subtree
            if old is not None:
                trie.memo_size -= old[0].shape[0]
            while trie.memo_size + k > Trie.MEMO_TOKENS:  # the least recently used first, a few at a time
                trie.memo_size -= memo.pop(next(iter(memo)))[0].shape[0]
            memo[key] = run
            trie.memo_size += k
    return got


def _touch(trie: Trie, keys) -> None:
    """Mark memo entries ``keys`` used now (to the end of the memo's order: eviction takes the front)."""
    memo = trie.memo
    with trie.lock:
        for key in keys:
            run = memo.pop(key, None)
            if run is not None:
                memo[key] = run


def lex_run(
    lex: int,
    text_ids: np.ndarray,
    flat: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    key: tuple | None = None,
) -> LexRun:
    """Compute the ``LexRun`` of a lexer state over the text tokens ``text_ids`` (all those whose first
    byte can continue the lexeme: the others end it before their first byte, see ``LexRun.cont``).
    ``rows``: their ``run`` if already computed (``trie_run``)."""
    final, death, pre = (
        rows if rows is not None else run(lex, text_ids, np.zeros_like(text_ids), flat, starts, lens)
    )
    inside = final != DEAD
    acc = SPACE.accepting_np
    crossing = (death >= 1) & acc[pre]
    cross = []
    if crossing.any():
        cid, cpre, coff = text_ids[crossing], pre[crossing], death[crossing]
        order = np.argsort(cpre, kind="stable")
        cid, cpre, coff = cid[order], cpre[order], coff[order]
        cuts = np.flatnonzero(np.diff(cpre)) + 1
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, cpre.size]):
            cross.append((int(cpre[a]), cid[a:b], coff[a:b]))
    cont = SPACE.cont(lex)
    return LexRun(text_ids[inside], final[inside], cont, cross, key or ("x", lex))


_BYTE = [bytes([b]) for b in range(256)]
WIDE = 16  # a lexer state with more live bytes is run vectorised, not walked


def walk_run(
    lex: int, toks: list[bytes], ids: np.ndarray, flat: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> LexRun:
    """``lex_run`` for a narrow lexer state: a walk down the sorted vocabulary (``toks``, their ids
    ``ids``), one prefix at a time, that visits only the prefixes the lexeme can take; a sub-range that
    reaches a wide lexer state is run vectorised from there. Cost: the prefixes visited, not the
    vocabulary."""
    accepting = SPACE.accepting
    live_bytes, step = SPACE.live_bytes, SPACE.step
    in_pos: list[int] = []
    in_fin: list[int] = []
    cross: dict[int, list[tuple[int, int, int]]] = {}
    wide: list[tuple[int, int, int, int]] = []
    todo = [(lex, b"", 0, len(toks))]
    while todo:
        s, p, lo, hi = todo.pop()
        d = len(p)
        if d and toks[lo] == p:  # the token that is exactly this prefix (sorted first)
            in_pos.append(lo)
            in_fin.append(s)
            lo += 1
            if lo >= hi:
                continue
        live_b = live_bytes(s)
        if d and len(live_b) > WIDE:
            wide.append((s, lo, hi, d))
            continue
        covered = lo
        for b in live_b:
            pb = p + _BYTE[b]
            a = bisect_left(toks, pb, covered, hi)
            z = bisect_left(toks, p + _BYTE[b + 1], a, hi) if b < 255 else hi
            if a < z:  # tokens go on through b: only now is its next state asked for
                if d and accepting[s] and a > covered:
                    cross.setdefault(s, []).append((covered, a, d))
                todo.append((step(s, b), pb, a, z))
                covered = z
        if d and accepting[s] and covered < hi:
            cross.setdefault(s, []).append((covered, hi, d))
    inside_ids = [ids[in_pos]]
    inside_final = [np.array(in_fin, dtype=np.int32)]
    groups: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for s, ranges in cross.items():
        for a, z, d in ranges:
            groups.setdefault(s, []).append((ids[a:z], np.full(z - a, d, dtype=np.int32)))
    for s, lo, hi, d in wide:
        rows = ids[lo:hi]
        final, death, pre = run(s, rows, np.full(rows.shape[0], d, dtype=np.int64), flat, starts, lens)
        inside = final != DEAD
        inside_ids.append(rows[inside])
        inside_final.append(final[inside])
        crossing = (death >= 1) & SPACE.accepting_np[pre]
        for p_state, sel in groups_by_pre(np.where(crossing, death, -1), pre):
            groups.setdefault(p_state, []).append((rows[sel], death[sel]))
    out_cross = [
        (p_state, np.concatenate([g[0] for g in parts]), np.concatenate([g[1] for g in parts]))
        for p_state, parts in sorted(groups.items())
    ]
    cont = SPACE.cont(lex)
    return LexRun(np.concatenate(inside_ids), np.concatenate(inside_final), cont, out_cross, ("x", lex))


def groups_by_pre(death: np.ndarray, pre: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Rows that died after an accepting lexeme, grouped by that lexer state: [(pre, row indices)]."""
    if death.size <= SCALAR_ROWS:  # a few rows: numpy's sort and split cost more than a dict
        accepting = SPACE.accepting
        groups: dict[int, list[int]] = {}
        for i, (d, p) in enumerate(zip(death.tolist(), pre.tolist())):
            if d >= 0 and accepting[p]:
                groups.setdefault(p, []).append(i)
        return [(p, np.array(groups[p], dtype=np.intp)) for p in sorted(groups)]
    crossing = (death >= 0) & SPACE.accepting_np[pre]
    idx = np.flatnonzero(crossing)
    if not idx.size:
        return []
    p = pre[idx]
    order = np.argsort(p, kind="stable")
    idx, p = idx[order], p[order]
    cuts = np.flatnonzero(np.diff(p)) + 1
    return [(int(p[a]), idx[a:b]) for a, b in zip(np.r_[0, cuts], np.r_[cuts, p.size])]
