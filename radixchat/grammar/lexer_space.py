"""The process-wide lexer state space: every terminal DFA and every lexer state, and how states step.

A *lexer state* is the set of terminals still alive in the current lexeme, each with its DFA state:
a canonical tuple ``((dfa_id, state), ...)``. Lexer states are interned process-wide in one
``LexerSpace`` (``SPACE``) and numbered (0 is the dead state), so a JSON string's interior is the same
lexer state in every JSON grammar, and what depends only on it is computed once per tokenizer (the runs
of the vocabulary through a state: ``vocab_runs``, cached in ``run_cache``).

Stepping a lexer state by a byte steps each component DFA and keeps the live ones (a lazily built
product automaton). Rows of the product are kept in fixed-size int arrays (scalar stepping in ``step``;
a state stepped on a byte or two needs no row: its components' moves are memoised) and in one numpy
table (vectorised steps of many states at once in ``next_states``).

What is kept per lexer state lives in a few flat arrays, not in an object per state: every container
object is one more thing each full collection of Python's garbage collector visits (an ``array`` is
tracked even though it holds no references), and a run over many schemas interns tens of thousands of
states; with an object or two per state, full collections grew long enough to land inside masks.
"""

from __future__ import annotations

import threading
from array import array

import numpy as np

from .counted import CountedDFA, compile_terminal
from .dfa import ByteDFA
from .dfa_store import DFAStore, untracked
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
WIDE = 16  # a lexer state with more live bytes is run vectorised, not walked


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
        # however many states; and no single array that grows: reallocating a big one is a copy of all
        # of it, paid inside whichever mask made it grow.
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
        # one where they are few. (A column per byte for every component, compared by hash, was costly
        # per row, and a trie run from a key family's first state builds many rows.)
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
        array extensions): one by one each costs a Python-level intern, and a walk of the vocabulary
        through a big DFA (a pattern under length bounds: a state per count) meets hundreds of new ones
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
        per distinct column) costs far more than the walk where a few tokens continue through one or
        two bytes."""
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
            got = bytes_of(bits)
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
                    got = (state, bytes_of(diff | others))
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
        (``twin_map``) instead of running the vocabulary again for each object's first key.
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
        a hundred names, a few dozen first letters between them, one each). A vectorised run from there
        builds a row of the product for every name prefix a token reaches; the walk steps only the
        bytes tokens take."""
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
        """``_live_bits`` of every state of plain DFA ``d``, when the DFA is made: a closed object's first
        key state has a DFA per name, and packing them all there would be paid by its mask."""
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
        steps a state on one or two bytes, and a row of 256 is costly where several terminals are
        alive (a lexeme's start)."""
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
        """The lexer state after byte ``data[i]`` from ``states[i]``, for every i (vectorised).

        One gather of the rows' slots, one of the flat table (numpy's two-index gather took twice as
        long: a whole-vocabulary run of Gemma's 588k-prefix trie calls this once per level)."""
        slots = self._slot[states] if len(self.is_start) <= self._slot.shape[0] else None
        if slots is None or (slots < 0).any():
            self.materialise(states)
            slots = self._slot[states]
        at = slots.astype(np.intp)
        at <<= 8
        at |= data
        return self._table.ravel().take(at)

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


def bytes_of(bits: int) -> bytes:
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
