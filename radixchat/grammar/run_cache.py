"""The per-tokenizer caches of the vocabulary's runs through lexer states, and the masks built from them.

``RunCache.of(info)`` is the one cache of a ``TokenizerInfo``, shared by every grammar compiled for it
(``CompiledGrammar.runs``) and living as long as the ``TokenizerInfo`` does. It keeps what depends on a
lexer state and the vocabulary only, never on a grammar's parser context: one ``LexRun`` per lexer
state (``lexrun``; it can be saved to disk and loaded again for the same vocabulary), the runs of the
rows a lexeme's end leaves over (``rows_run``/``rows_groups``), the profiles of counted loops
(``counted_runs``), the prefix trie and its memo of subtree runs (``vocab_trie``), and the interned masks.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
import zlib
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from .counted import CountedDFA
from .counted_runs import Profile, counted_run, profile
from .dfa_store import untracked
from .errors import GrammarError
from .lexer_space import DEAD, SPACE
from .tokenizer import TokenizerInfo
from .vocab_runs import LexRun, concat_ranges, groups_by_pre, lex_run, walk_run
from .vocab_runs import run as run_rows
from .vocab_trie import Trie, trie_run

#: Version of the names in ``save_cache``'s index (2: counted DFAs' states are ``[skeleton, count]``).
CACHE_FORMAT = 2
FILTER_ROWS = 256  # rows_groups runs a bigger group's rows only where their next byte lives


class RunCache:
    """The context-independent runs and masks of one tokenizer (see the module docstring).

    Holds the vocabulary's arrays, not the ``TokenizerInfo``: ``of`` keys its caches by the info weakly,
    and a cache that held its info would keep it alive."""

    _of: weakref.WeakKeyDictionary[TokenizerInfo, RunCache] = weakref.WeakKeyDictionary()
    _of_lock = threading.Lock()

    @classmethod
    def of(cls, info: TokenizerInfo) -> RunCache:
        """The cache of ``info`` (made on first use: the trie's build is paid by a compile, not a mask)."""
        got = cls._of.get(info)
        if got is None:
            with cls._of_lock:
                got = cls._of.get(info)
                if got is None:
                    got = cls._of[info] = cls(info)
        return got

    def __init__(self, info: TokenizerInfo) -> None:
        self.vocab_size = info.vocab_size
        self.fingerprint = info.fingerprint
        self.text_ids, self.flat, self.starts, self.lens = info.text_ids, info.flat, info.starts, info.lens
        self._first = info.first_byte
        self._by_first, self._first_bounds = info.by_first_byte, info.first_byte_bounds
        self._sorted, self._sorted_ids = info.sorted_bytes, info.sorted_ids
        # lexer state -> its LexRun's fields, in an ``untracked`` box (``lexrun``)
        self._runs: dict[int, np.ndarray] = {}
        # lexer state -> its LexRun over the tokens of a few first bytes, and those tokens (``lexrun_part``)
        self._parts: dict[int, np.ndarray] = {}
        # Built with the cache, in the first compile, not at the first wide lexer state (a mask would pay it).
        self.trie = Trie(self._sorted, self._sorted_ids)  # the vocabulary's prefix trie (``vocab_trie.Trie``)
        self._n_derived = 0  # runs of counted states in _runs (derived, never saved)
        self._profiles: dict[tuple, Profile] = {}  # counted loops: (loop key, local state) -> profile
        #: Interned masks: packed bits -> one read-only-by-contract bool array per distinct mask.
        self.masks: dict[bytes, np.ndarray] = {}
        self._ends_first: dict[int, np.ndarray] = {}
        self._ends_mask: dict[int, np.ndarray] = {}
        self._rows: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._groups: dict[int, np.ndarray] = {}  # hash of a rows name -> name, inside, subs: untracked
        self._row_digests: dict[int, np.ndarray] = {}  # hash of a rows key -> key, digest: untracked
        self._row_content: dict[int, np.ndarray] = {}  # a big group's digest -> its ids, offs: untracked
        self._row_orders: dict[bytes | int, np.ndarray] = {}  # a big group's digest -> its rows by next byte
        self._lock = threading.Lock()

    def lexrun(self, lex: int) -> LexRun:
        got = self._runs.get(lex)
        if got is not None:
            ids, finals, cont, cross, key = got
            return LexRun(ids, finals if finals is not None else partial(self._finals, lex), cont, cross, key)
        run = self._counted(lex)
        twin = SPACE.canon(lex) if run is None else lex
        if twin != lex and twin in self._runs:  # its twin's run, states renamed (``LexerSpace.canon``)
            ids, finals, cont, cross, key = self._runs[twin]
            first, table = SPACE.twin_map(lex)
            cross = [(int(table[p - first + 1]), i, o) for p, i, o in cross]
            run = LexRun(ids, table[finals - first + 1], cont, cross, key)
        elif run is None:
            if SPACE.walkable(lex):
                run = walk_run(lex, self._sorted, self._sorted_ids, self.flat, self.starts, self.lens)
            else:
                trie = self.trie
                run = lex_run(lex, trie.ids, self.flat, self.starts, self.lens, trie_run(lex, trie))
        with self._lock:
            if lex not in self._runs:
                # Kept as plain fields in an untracked box (a LexRun object, a counted run's closure or a
                # tuple would be walked by every full collection: tens of thousands over a long run). A
                # counted run's finals are derived again when asked (rarely: budget steering).
                finals = run.finals if isinstance(run.finals, np.ndarray) else None
                self._runs[lex] = untracked(run.inside_ids, finals, run.cont, run.cross, run.key)
                self._n_derived += run.derived
        return run

    def lexrun_part(self, lex: int, first: bytes) -> tuple[LexRun, np.ndarray]:
        """The ``LexRun`` of ``lex`` over the text tokens whose first byte is in ``first`` only, and those
        tokens (cached per state: ``first`` must be the same each time; its groups are keyed
        ``("xs", lex)``). For a state that steps like its ``LexerSpace.base`` on every other byte."""
        got = self._parts.get(lex)
        if got is None:
            trie = self.trie
            pick = np.zeros(256, dtype=bool)
            pick[np.frombuffer(first, dtype=np.uint8)] = True
            sel = np.flatnonzero(pick[trie.byte[0]])
            ids = trie.ids[concat_ranges(trie.first[sel], trie.first[sel + 1])]
            run = lex_run(lex, ids, self.flat, self.starts, self.lens, trie_run(lex, trie, sel), ("xs", lex))
            got = self._parts[lex] = untracked(run.inside_ids, run.inside_final, run.cont, run.cross, ids)
        inside, finals, cont, cross, ids = got
        return LexRun(inside, finals, cont, cross, ("xs", lex)), ids

    def _finals(self, lex: int) -> np.ndarray:
        return self._counted(lex).inside_final

    def _counted(self, lex: int) -> LexRun | None:
        """The run of a lexer state that is one counted DFA inside its loop, derived from the loop's
        profile (see ``counted_runs``); None for any other state."""
        comps = SPACE.comps[lex]
        if len(comps) != 1:
            return None
        d, s = comps[0]
        if SPACE.dfas.plain[d]:
            return None
        dfa = SPACE.dfas[d]
        local = dfa.in_loop(s)
        if local < 0:
            return None
        return counted_run(d, dfa, s, local, self._profile(dfa, local))

    def _profile(self, dfa: CountedDFA, local: int) -> Profile:
        key = (dfa.loop.key, local)
        prof = self._profiles.get(key)
        if prof is None:
            prof = self._profiles[key] = profile(
                dfa.loop, local, self._by_first, self._first_bounds, self.flat, self.starts, self.lens
            )
        return prof

    def prepare(self, dfa_ids: Iterable[int]) -> None:
        """Build now what the masks of these terminals' DFAs will need once per tokenizer: the profiles
        of counted loops (a run of the vocabulary through the loop's skeleton), so that a grammar's compile pays them, not one of its masks."""
        for d in dfa_ids:
            dfa = SPACE.dfas[d]
            if isinstance(dfa, CountedDFA):
                for local in range(dfa.loop.n_loop):
                    self._profile(dfa, local)

    def prepare_state(self, lex: int) -> None:
        """Run now what a mask of lexer state ``lex`` will read from this cache (for a compile that runs
        likely states ahead: ``CompiledGrammar._prepare``): its run, or, for a state with a base
        (``LexerSpace.base``), the base's run and its own over the few first bytes it differs on."""
        base = SPACE.base(lex)
        if base is None:
            self.lexrun(lex)
        else:
            self.lexrun(base[0])
            self.lexrun_part(lex, base[1])

    def ends_first_mask(self, lex: int, run: LexRun) -> np.ndarray:
        """bool[vocab_size]: the text tokens whose first byte cannot continue the lexeme of ``lex``."""
        got = self._ends_mask.get(lex)
        if got is None:
            got = np.zeros(self.vocab_size, dtype=bool)
            got[self.text_ids] = ~run.cont[self._first]
            self._ends_mask[lex] = got
        return got

    def ends_first(self, lex: int, run: LexRun) -> np.ndarray:
        """Text token ids whose first byte cannot continue the lexeme of ``lex`` (cached)."""
        got = self._ends_first.get(lex)
        if got is None:
            ids = self.text_ids
            got = self._ends_first[lex] = ids[~run.cont[self.flat[self.starts[ids]]]]
        return got

    def _rows_name(self, key, lex: int, ids: np.ndarray, offs: np.ndarray) -> tuple[bytes | int, int]:
        """The cache name of rows ``key`` run from ``lex``: a name of the rows' content, so that
        equal rows share their runs (each name's key state in an object ends its key on ``"`` and has
        the same few dozen rows after it, ``:``, ``:"``, ``,``..., under a key of its own)."""
        h = hash(key)
        got = self._row_digests.get(h)
        if got is None or got[0] != key:
            got = self._row_digests[h] = untracked(key, self._rows_digest(ids, offs))
        return got[1], lex

    def _rows_digest(self, ids: np.ndarray, offs: np.ndarray) -> bytes | int:
        """A name for the rows ``(ids, offs)``: equal rows get the same one, different rows different
        ones. Up to ``FILTER_ROWS`` rows: a BLAKE2 digest. More (a whitespace group: every token that
        starts with whitespace): a digest of them would be paid in the mask of every new lexer state that
        has such a group, so they are named by a CRC, much cheaper, and compared with the rows kept under
        it; rows with the same CRC differ by a last index."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        offs = np.ascontiguousarray(offs, dtype=np.int32)
        if ids.size <= FILTER_ROWS:
            return hashlib.blake2b(ids.tobytes() + offs.tobytes(), digest_size=16).digest()
        crc = (ids.size << 64 | zlib.crc32(ids) << 32 | zlib.crc32(offs)) << 8
        box = untracked(ids, offs)
        for n in range(256):
            kept = self._row_content.setdefault(crc | n, box)
            if kept is box or (np.array_equal(kept[0], ids) and np.array_equal(kept[1], offs)):
                return crc | n
        raise GrammarError("over 256 different crossing rows with one CRC")

    def _rows_by_next_byte(self, digest: bytes | int, ids: np.ndarray, offs: np.ndarray) -> np.ndarray:
        """``untracked(order, bounds)``: the rows ordered by their next byte (256: none left) and where
        each byte's rows start in that order (cached per rows digest, for big groups)."""
        got = self._row_orders.get(digest)
        if got is None:
            pos = self.starts[ids] + offs
            nxt = np.where(
                pos < self.starts[ids] + self.lens[ids], self.flat[np.minimum(pos, self.flat.size - 1)], 256
            )
            order = np.argsort(nxt, kind="stable").astype(np.int32)
            got = self._row_orders[digest] = untracked(order, np.searchsorted(nxt[order], np.arange(258)))
        return got

    def rows_run(self, key, lex: int, ids: np.ndarray, offs: np.ndarray):
        """``vocab_runs.run`` of rows ``(ids, offs)`` (identified by ``key``) from ``lex`` (cached:
        context-independent)."""
        name = self._rows_name(key, lex, ids, offs)
        got = self._rows.get(name)
        if got is None:
            got = self._rows[name] = run_rows(lex, ids, offs, self.flat, self.starts, self.lens)
        return got

    def rows_groups(self, key, lex: int, ids: np.ndarray, offs: np.ndarray):
        """``rows_run`` split for the mask: ``(ids of the rows that stay inside a lexeme, [(pre, ids, offs,
        key) of the rows whose lexeme ended in accepting pre, for each pre])`` (cached:
        context-independent)."""
        name = self._rows_name(key, lex, ids, offs)
        h = hash(name)
        got = self._groups.get(h)
        if got is None or got[0] != name:  # not cached (or another name with the same hash was)
            # the raw rows are not kept as well (``rows_run`` keeps them, for budget steering)
            got = self._rows.get(name)
            if got is None and ids.size > FILTER_ROWS and not SPACE.accepting[lex]:
                # A big group (the tokens that start with whitespace, after it): only the rows whose
                # next byte ``lex`` takes can matter; the others die on it, after a lexeme that does not
                # accept (or rows that end there, byte 256, which stay inside).
                order, bounds = self._rows_by_next_byte(name[0], ids, offs)
                live = np.r_[np.frombuffer(SPACE.live_bytes(lex), dtype=np.uint8).astype(np.int64), 256]
                sel = np.sort(order[concat_ranges(bounds[live], bounds[live + 1])])
                ids, offs = ids[sel], offs[sel]
            final, death, pres = got or run_rows(lex, ids, offs, self.flat, self.starts, self.lens)
            # each sub-group's key: short, and the same wherever these rows are met (a key nesting its
            # parents' keys was hashed whole at every lookup, which grew with the depth of a crossing token)
            subs = tuple(
                (p, ids[sel], death[sel], (name[0], lex, p)) for p, sel in groups_by_pre(death, pres)
            )
            got = self._groups[h] = untracked(name, ids[final != DEAD], subs)
        return got[1], got[2]

    def intern_mask(self, mask: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """One shared array per distinct mask: returns (a tensor over it, the array); never mutate them."""
        key = np.packbits(mask).tobytes()
        view = self.masks.get(key)
        if view is None:
            view = self.masks[key] = mask.copy()
        # a new tensor object over the shared memory: the cache keeps only the numpy array, which the
        # garbage collector does not track (a tensor is tracked; the cache holds thousands)
        return torch.from_numpy(view), view

    @property
    def cached_lexer_states(self) -> int:
        return len(self._runs)

    @property
    def cached_states(self) -> int:
        """How many lexer states the context-independent cache holds that ``save_cache`` writes
        (counted states' runs are derived from their loop's profile, not saved)."""
        return len(self._runs) - self._n_derived

    def save_cache(self, path: str | Path) -> int:
        """Write the context-independent cache (one ``LexRun`` per lexer state seen) to ``path`` (npz).

        Returns the number of lexer states written. Only useful with the same vocabulary: ``load_cache``
        checks the fingerprint.
        """
        arrays: dict[str, np.ndarray] = {}
        index = []
        runs = [(lex, run) for lex in list(self._runs) if not (run := self.lexrun(lex)).derived]
        for k, (lex, run) in enumerate(runs):
            finals = np.unique(run.inside_final)
            index.append(
                {
                    "lex": SPACE.describe(lex),
                    "finals": [SPACE.describe(int(f)) for f in finals],
                    "cross": [SPACE.describe(p) for p, _, _ in run.cross],
                }
            )
            arrays[f"i{k}"] = run.inside_ids
            arrays[f"f{k}"] = np.searchsorted(finals, run.inside_final).astype(np.int32)
            arrays[f"c{k}"] = run.cont
            for j, (_, ids, offs) in enumerate(run.cross):
                arrays[f"x{k}_{j}"] = ids
                arrays[f"o{k}_{j}"] = offs
        meta = {"fingerprint": self.fingerprint, "format": CACHE_FORMAT, "index": index}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)
        return len(index)

    def load_cache(self, path: str | Path) -> int:
        """Load a cache written by ``save_cache``; returns how many lexer states were added."""
        with np.load(path) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            if meta["fingerprint"] != self.fingerprint:
                raise GrammarError(f"{path}: mask cache was written for a different vocabulary")
            if meta.get("format") != CACHE_FORMAT:
                raise GrammarError(f"{path}: mask cache was written by another version (lexer states differ)")
            added = 0
            for k, entry in enumerate(meta["index"]):
                lex = _intern_description(entry["lex"])
                if lex in self._runs:
                    continue
                finals = np.array([_intern_description(d) for d in entry["finals"]], dtype=np.int32)
                cross = [
                    (_intern_description(d), data[f"x{k}_{j}"], data[f"o{k}_{j}"])
                    for j, d in enumerate(entry["cross"])
                ]
                inside_ids = data[f"i{k}"]
                inside_final = finals[data[f"f{k}"]] if len(finals) else np.zeros(0, dtype=np.int32)
                self._runs[lex] = untracked(inside_ids, inside_final, data[f"c{k}"], tuple(cross), ("x", lex))
                added += 1
        return added


def _intern_description(desc) -> int:
    comps = tuple(sorted(SPACE.state_of(pattern, state) for pattern, state in desc))
    return SPACE.intern(comps)
