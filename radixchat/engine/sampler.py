"""Turns the logits of one step into the next token of each sampling request."""

from __future__ import annotations

import torch

from radixchat.engine.request import Request

FAILED = -1  # the token "sampled" for a request whose sampling raised (its error is set)

MIN_TEMPERATURE = 1e-4  # logits of ~±50 stay finite in float32 when divided by it


def apply_repetition_penalty(row: torch.Tensor, idx: torch.Tensor, penalty: float) -> None:
    """HF's rule on every prompt and output token (``idx``: their distinct ids): divide positive logits,
    multiply negative ones."""
    idx = idx.to(row.device)
    score = row[idx]
    row[idx] = torch.where(score < 0, score * penalty, score / penalty)


def penalized_ids(req: Request) -> torch.Tensor:
    """The distinct ids of ``req``'s prompt and output, brought up to date with the tokens sampled since the
    last call (not rebuilt from the whole history each step)."""
    n_prompt, n_out = len(req.prompt_ids), len(req.output_ids)
    cached = req.penalty_ids
    if cached is None or cached[0] != n_prompt or cached[1] > n_out:
        seen = set(req.prompt_ids) | set(req.output_ids)
        ids = torch.tensor(sorted(seen), dtype=torch.int64)
    else:
        _, done, seen, ids = cached
        new = {t for t in req.output_ids[done:] if t not in seen}
        if new:
            seen |= new
            ids = torch.cat([ids, torch.tensor(sorted(new), dtype=torch.int64)])
    req.penalty_ids = (n_prompt, n_out, seen, ids)
    return ids


#: How many of the most likely tokens the nucleus is first looked for among (then four times as many, up to
#: the whole vocabulary): a nucleus is a handful of tokens, and a sort of the whole vocabulary every step
#: costs as much as a small model's step.
NUCLEUS_CANDIDATES = 64


def top_k_top_p(row: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The tokens top-k and top-p keep of ``row`` (logits over the vocabulary, already divided by the
    temperature), with their logits; None when both are off (every token stays).

    Top-k keeps every token whose logit reaches the k-th largest (ties included). Top-p then keeps the most
    likely tokens until the probability mass before the next one reaches ``top_p`` (the first always
    stays), the probabilities being the softmax over what top-k kept."""
    n = row.numel()
    if not 0 < top_k < n and top_p >= 1.0:
        return None
    ids = None
    if 0 < top_k < n:
        kth = torch.topk(row, top_k).values[-1]
        ids = ((row >= kth) & (row > float("-inf"))).nonzero().flatten()  # a grammar may allow fewer than k
        logits, order = torch.sort(row[ids], descending=True)
        ids = ids[order]
        if top_p >= 1.0:
            return ids, logits
        probs = logits.softmax(-1)
    else:
        probs = row.softmax(-1)
    m = min(NUCLEUS_CANDIDATES, probs.numel())
    while True:
        top, order = torch.topk(probs, m)  # sorted, most likely first
        # Drop a token when the mass before it already reaches top_p; the mass only grows down the list.
        # (The sums in float64: over thousands of tokens float32's would move the boundary by dozens.)
        drop = (top.double().cumsum(-1) - top) >= top_p
        if bool(drop[1:].any()) or m == probs.numel():
            break
        m = min(4 * m, probs.numel())
    drop[0] = False  # even when top_p rounds to 0 in float32
    order = order[~drop]
    if ids is None:
        return order, row[order]
    return ids[order], logits[order]


class Sampler:
    def __init__(self, vocab_size: int, eos_ids: set[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        """One token per request (``FAILED`` where sampling raised). ``logits`` is float32
        ``[len(reqs), vocab]`` and may be modified."""
        if logits.shape[1] > self.vocab_size:  # padded lm_head
            logits = logits[:, : self.vocab_size]
        simple = [i for i, r in enumerate(reqs) if self._is_plain_greedy(r)]
        tokens = [0] * len(reqs)
        if simple:
            picked = (
                logits[simple].argmax(-1).tolist() if len(simple) < len(reqs) else logits.argmax(-1).tolist()
            )
            for i, t in zip(simple, picked):
                tokens[i] = t
        for i, req in enumerate(reqs):
            if self._is_plain_greedy(req):
                continue
            try:
                tokens[i] = self._sample_row(logits[i], req)
            except Exception as exc:  # a failing grammar fails its own request only
                req.error = f"sampling failed: {type(exc).__name__}: {exc}"
                tokens[i] = FAILED
        return tokens

    @staticmethod
    def _is_plain_greedy(req: Request) -> bool:
        p = req.params
        return p.greedy and p.repetition_penalty == 1.0 and req.matcher is None

    def _sample_row(self, row: torch.Tensor, req: Request) -> int:
        p = req.params
        if p.repetition_penalty != 1.0:
            apply_repetition_penalty(row, penalized_ids(req), p.repetition_penalty)
        if req.matcher is not None:
            remaining = min(p.max_tokens, req.max_total_len - len(req.prompt_ids)) - len(req.output_ids)
            mask = req.matcher.allowed(remaining)
            req.budget_cut = False
            # Only the very last token counts: earlier, a forced end follows a complete piece (a call,
            # a value) the model would have followed with more, which is not a cut.
            if remaining <= 1 and req.matcher.budget_limited:
                full = req.matcher.allowed()[: row.numel()].to(row.device)
                preferred = int(row.masked_fill(~full, float("-inf")).argmax())
                req.budget_cut = preferred not in self.eos_ids
            row.masked_fill_(~mask[: row.numel()].to(row.device), float("-inf"))
        if p.greedy:
            return int(row.argmax())
        # A temperature too small to divide by without overflow samples as greedy does.
        row = row / max(p.temperature, MIN_TEMPERATURE)
        kept = top_k_top_p(row, p.top_k, p.top_p)
        ids, logits = kept if kept is not None else (None, row)
        probs = logits.softmax(-1)  # over the kept tokens: the distribution the others' -inf would leave
        if req.generator is not None and req.generator.device != probs.device:
            probs = probs.cpu()
        pick = int(torch.multinomial(probs, 1, generator=req.generator))
        return pick if ids is None else int(ids[pick])
