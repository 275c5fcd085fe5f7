"""Token runs of counted lexer states, derived from one run of the loop's skeleton per tokenizer.

A lexer state that is one ``CountedDFA`` inside its loop is ``(local state l, count c)``. What a token
does from there is what it does from ``l`` in the skeleton (``Loop``), provided the count allows it: it
may begin ``n`` items only while ``c + n <= hi``, and if it leaves the loop it must have reached
``c + n >= lo``. So one vectorised run from ``l`` over the vocabulary (a ``Profile``: each token's
skeleton outcome, items begun ``n`` and whether it left the loop) serves every count and every counted
terminal with the same loop; a count's run is a selection from it. Selections depend on ``c`` only
through ``(min(hi - c, max n), clip(lo - c, 0, max n + 1))``, so counts in the middle of long bounds
share one selection, and their crossing groups share one ``LexRun.key`` (the caches of what follows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .counted import CountedDFA, Loop
from .lexer_space import SPACE
from .vocab_runs import LexRun, run_vectorised


@dataclass(slots=True)
class Profile:
    """The skeleton run of the text tokens from one loop-local state (see the module docstring).

    ``in_*``: tokens that stay inside the lexeme (final local state ``in_f``); ``cr_*``: tokens whose
    lexeme ends (accepting) at byte offset ``cr_off`` in local state ``cr_pre``; ``*_n``: items begun;
    ``*_ex``: whether the loop was left."""

    in_ids: np.ndarray
    in_f: np.ndarray
    in_n: np.ndarray
    in_ex: np.ndarray
    cr_ids: np.ndarray
    cr_off: np.ndarray
    cr_pre: np.ndarray
    cr_n: np.ndarray
    cr_ex: np.ndarray
    max_n: int
    all_rows: np.ndarray
    selections: dict = field(default_factory=dict)  # (most, least) -> Selection


@dataclass(slots=True)
class Selection:
    inside_ids: np.ndarray
    inside_rows: np.ndarray  # indices into the profile's ``in_*`` arrays
    cross: list[tuple[int, np.ndarray, np.ndarray]]  # (loop-local pre state, ids, offsets)


def profile(
    loop: Loop, local: int, by_first, first_bounds, flat: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> Profile:
    """Run the text tokens whose first byte ``local`` can take through the skeleton, vectorised."""
    live = np.flatnonzero(loop.trans[local] >= 0).tolist()
    ids = np.concatenate([by_first[first_bounds[x] : first_bounds[x + 1]] for x in live] + [by_first[:0]])
    n_rows = ids.shape[0]
    items = np.zeros(n_rows, dtype=np.int32)
    left = np.zeros(n_rows, dtype=bool)
    trans, ann = loop.trans, loop.ann

    def count(rows: np.ndarray, cur: np.ndarray, byte: np.ndarray) -> None:
        a = ann[cur, byte]
        items[rows] += a == 1
        left[rows] |= a == 2

    final, death, pre = run_vectorised(
        lambda cur, byte: trans[cur, byte],
        np.full(n_rows, local, dtype=np.int32),
        np.zeros(n_rows, dtype=np.int64),
        starts[ids].astype(np.int64),
        lens[ids].astype(np.int64),
        flat,
        dead=-1,
        visit=count,
    )
    inside = final >= 0
    crossing = (death >= 1) & loop.accept[pre]
    return Profile(
        ids[inside],
        final[inside],
        items[inside],
        left[inside],
        ids[crossing],
        death[crossing],
        pre[crossing],
        items[crossing],
        left[crossing],
        int(items.max()) if n_rows else 0,
        np.arange(int(inside.sum())),
    )


def _select(p: Profile, cls: tuple[int, int]) -> Selection:
    got = p.selections.get(cls)
    if got is not None:
        return got
    most, least = cls  # items a token may begin; items a token that leaves the loop must have begun
    ok = (p.in_n <= most) & (~p.in_ex | (p.in_n >= least))
    rows = p.all_rows if ok.all() else np.flatnonzero(ok)  # far from the bounds: no copy
    okc = (p.cr_n <= most) & (~p.cr_ex | (p.cr_n >= least))
    cross = []
    if okc.any():
        cid, cpre, coff = p.cr_ids[okc], p.cr_pre[okc], p.cr_off[okc]
        for q in np.unique(cpre).tolist():
            sel = cpre == q
            cross.append((q, cid[sel], coff[sel]))
    got = p.selections[cls] = Selection(p.in_ids if rows is p.all_rows else p.in_ids[rows], rows, cross)
    return got


def counted_run(d: int, dfa: CountedDFA, s: int, local: int, p: Profile) -> LexRun:
    """The ``LexRun`` of the lexer state that is only ``(d, s)``, ``s`` in the loop at ``local``."""
    _, c = dfa.state(s)
    most = p.max_n if dfa.hi is None else min(dfa.hi - c, p.max_n)
    least = min(max(dfa.lo - c, 0), p.max_n + 1)
    sel = _select(p, (most, least))
    lex = SPACE.intern(((d, s),))
    cross = [(SPACE.intern(((d, dfa.state_id((dfa.base + q, 0))),)), ids, offs) for q, ids, offs in sel.cross]

    def finals() -> np.ndarray:
        f = p.in_f[sel.inside_rows].astype(np.int64)
        n = p.in_n[sel.inside_rows].astype(np.int64)
        width = p.max_n + 1
        uniq, inv = np.unique(f * width + n, return_inverse=True)
        out = []
        for u in uniq.tolist():
            q, k = divmod(u, width)
            out.append(SPACE.intern(((d, dfa.state_id(dfa.after(q, c, k))),)))
        return np.array(out, dtype=np.int32)[inv.reshape(-1)]

    cont = SPACE.cont(lex)
    return LexRun(sel.inside_ids, finals, cont, cross, ("xc", d, local, most, least))
