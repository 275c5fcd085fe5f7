"""Budget steering: which tokens still let the output be completed within the remaining tokens.

The cost of a state is the length in bytes of its shortest completion (``CompiledGrammar.lex_cost``:
the current lexeme's DFA distance plus the parser's completion over LR(0) kernel items). A completion
of k bytes takes at most k tokens when each of its bytes is a token (true of ASCII in byte-level
BPE vocabularies), so bytes are a conservative bound on tokens.

``token_costs`` mirrors the mask computation of ``CompiledGrammar.entry`` (same lexer runs, from the
same per-tokenizer caches) but returns, per token, the cost of the state after it.
"""

from __future__ import annotations

import numpy as np
import torch

from .lexer_space import DEAD, SPACE
from .vocab_runs import groups_by_pre


def _state_costs(g, stack, finals: np.ndarray) -> np.ndarray:
    uniq, inv = np.unique(finals, return_inverse=True)
    c = np.array([g.lex_cost(stack, int(f)) for f in uniq.tolist()], dtype=np.int64)
    return c[inv.reshape(-1)]


def token_costs(g, stack: tuple[int, ...], lex: int) -> np.ndarray:
    """int64[n_tokens]: -1 where the token is not allowed, else the cost after taking it."""
    info = g.info
    run = g.runs.lexrun(lex)
    out = np.full(len(info.token_bytes), -1, dtype=np.int64)
    if run.inside_ids.size:
        out[run.inside_ids] = _state_costs(g, stack, run.inside_final)
    if SPACE.accepting[lex]:
        nxt, _ = g.after_lexeme(stack, lex)
        sel = g.runs.ends_first(lex, run) if nxt else None
        for st2, lex0 in nxt:
            out[sel] = cheapest(out[sel], token_costs(g, st2, lex0)[sel])
    for k, (pre, ids, offs) in enumerate(run.cross):
        out[ids] = _group_costs(g, stack, pre, (run.key, k), ids, offs)
    for tid, data in g.named_special:
        states = g.feed(stack, lex, data)
        if states:
            out[tid] = min(g.lex_cost(*st) for st in states)
    return out


def cheapest(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise minimum of two cost arrays where -1 means "not allowed"."""
    return np.where(a < 0, b, np.where(b < 0, a, np.minimum(a, b)))


def _group_costs(g, stack, pre: int, key: tuple, ids: np.ndarray, offs: np.ndarray) -> np.ndarray:
    vals = np.full(ids.shape[0], -1, dtype=np.int64)
    nxt, _ = g.after_lexeme(stack, pre)
    for st2, lex0 in nxt:
        here = np.full(ids.shape[0], -1, dtype=np.int64)
        final, death, pres = g.runs.rows_run(key, lex0, ids, offs)
        alive = final != DEAD
        if alive.any():
            here[alive] = _state_costs(g, st2, final[alive])
        for p, sel in groups_by_pre(death, pres):
            here[sel] = _group_costs(g, st2, p, (key, lex0, p), ids[sel], death[sel])
        vals = cheapest(vals, here)
    return vals


def budget_mask(g, configs: tuple, remaining: int) -> torch.Tensor:
    """Tokens after which the output can still be completed in ``remaining - 1`` tokens (EOS counts
    one), plus EOS when accepting. Never all-False: if nothing fits, the tokens that leave the shortest
    completion are allowed (the engine will then stop at its token limit and report it)."""
    limit = remaining - 2
    costs = token_costs(g, *configs[0])
    for st, lx in configs[1:]:
        costs = cheapest(costs, token_costs(g, st, lx))
    accepting = any(g.is_accepting(st, lx)[0] for st, lx in configs)
    ok = (costs >= 0) & (costs <= limit)
    if not ok.any() and not accepting:
        valid = costs >= 0
        ok = valid & (costs == costs[valid].min()) if valid.any() else valid
    mask = np.zeros(g.info.vocab_size, dtype=bool)
    mask[: ok.shape[0]] = ok
    if accepting:
        mask[list(g.info.eos_ids)] = True
    if not mask.any():
        return g.union(configs).tensor if len(configs) > 1 else g.entry(*configs[0]).tensor
    return g.runs.intern_mask(mask)[0]
