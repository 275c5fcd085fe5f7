"""Runs of the vocabulary through the lexer space: what each token does from one lexer state.

``LexRun`` is the outcome of every text token from one lexer state (stays inside the lexeme, ends it,
or dies); ``lex_run`` computes it with a vectorised run (``run``: one numpy step per byte position over
every token at once), ``walk_run`` with a walk down the sorted vocabulary for narrow states. The
prefix trie's runs are in ``vocab_trie``; the per-tokenizer caches of these runs in ``run_cache``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .lexer_space import DEAD, SPACE, WIDE

BYTE = [bytes([b]) for b in range(256)]  # each byte as a one-byte ``bytes`` (prefix walks)


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
    cur = np.full(n, lex, dtype=np.int32)
    return run_vectorised(
        SPACE.next_states,
        cur,
        offs.astype(np.int64),
        starts[ids].astype(np.int64),
        lens[ids].astype(np.int64),
        flat,
    )


def run_vectorised(
    step: Callable[[np.ndarray, np.ndarray], np.ndarray],
    cur: np.ndarray,
    pos: np.ndarray,
    base: np.ndarray,
    end: np.ndarray,
    flat: np.ndarray,
    dead: int = DEAD,
    visit: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step rows of bytes through an automaton, one numpy step per byte position for all rows at once:
    the loop under ``run`` (lexer states) and ``counted_runs.profile`` (a counted loop's skeleton).

    Row ``i`` is the bytes ``flat[base[i] + pos[i] : base[i] + end[i]]`` run from state ``cur[i]``;
    ``step(states, bytes)`` gives the next states, ``dead`` where a row cannot go on. ``visit(rows,
    states, bytes)``, if given, sees every step that rows take (row indices, states before, bytes).
    Returns ``(final, death, pre)`` as ``run`` does, with ``dead`` for DEAD.
    """
    n = cur.shape[0]
    final = np.full(n, dead, dtype=np.int32)
    death = np.full(n, -1, dtype=np.int32)
    pre = np.zeros(n, dtype=np.int32)
    rows = np.arange(n)
    done = pos >= end
    if done.any():
        final[rows[done]] = cur[done]
        keep = ~done
        rows, cur, pos, base, end = rows[keep], cur[keep], pos[keep], base[keep], end[keep]
    while rows.size:
        byte = flat[base + pos]
        nxt = step(cur, byte)
        died = nxt == dead
        if died.any():
            r = rows[died]
            death[r] = pos[died]
            pre[r] = cur[died]
            keep = ~died
            rows, nxt, pos, base, end = rows[keep], nxt[keep], pos[keep], base[keep], end[keep]
            if visit is not None:
                cur, byte = cur[keep], byte[keep]
        if visit is not None:
            visit(rows, cur, byte)
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
        run_bytes(lex, flat[a : a + z].tobytes(), o)
        for a, o, z in zip(starts[ids].tolist(), offs.tolist(), lens[ids].tolist())
    ]
    out = np.array(got, dtype=np.int32).reshape(-1, 3)
    return out[:, 0].copy(), out[:, 1].copy(), out[:, 2].copy()


def run_bytes(lex: int, tok: bytes, d: int) -> tuple[int, int, int]:
    """``run`` of one token's bytes from offset ``d`` on, from ``lex``: (final, death, pre)."""
    step = SPACE.step
    cur = lex
    for o in range(d, len(tok)):
        nxt = step(cur, tok[o])
        if nxt == DEAD:
            return DEAD, o, cur
        cur = nxt
    return cur, -1, 0


def concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``lo[i]`` to ``hi[i]``, concatenated."""
    sizes = hi - lo
    return np.arange(int(sizes.sum())) + np.repeat(lo - (np.cumsum(sizes) - sizes), sizes)


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
        if d and toks[lo] == p:  # the tokens that are exactly this prefix (sorted first; maybe several:
            while lo < hi and toks[lo] == p:  # Gemma's byte tokens repeat its one-byte pieces)
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
            pb = p + BYTE[b]
            a = bisect_left(toks, pb, covered, hi)
            z = bisect_left(toks, p + BYTE[b + 1], a, hi) if b < 255 else hi
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
