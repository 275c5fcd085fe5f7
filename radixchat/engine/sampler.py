"""Turns the logits of one step into the next token of each sampling request."""

from __future__ import annotations

import torch

from radixchat.engine.request import Request

FAILED = -1  # the token "sampled" for a request whose sampling raised (its error is set)

MIN_TEMPERATURE = 1e-4  # logits of ~±50 stay finite in float32 when divided by it


def apply_repetition_penalty(row: torch.Tensor, ids: list[int], penalty: float) -> None:
    """HF's rule on every prompt and output token: divide positive logits, multiply negative ones."""
    idx = torch.tensor(sorted(set(ids)), dtype=torch.int64, device=row.device)
    score = row[idx]
    row[idx] = torch.where(score < 0, score * penalty, score / penalty)


def top_k_top_p_filter(row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if 0 < top_k < row.numel():
        kth = torch.topk(row, top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (the first token always stays).
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[0] = False  # even when top_p rounds to 0 in float32
        row = row.masked_fill(torch.zeros_like(drop).scatter_(0, order, drop), float("-inf"))
    return row


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
            apply_repetition_penalty(row, req.all_ids, p.repetition_penalty)
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
        row = top_k_top_p_filter(row / max(p.temperature, MIN_TEMPERATURE), p.top_k, p.top_p)
        probs = row.softmax(-1)
        if req.generator is not None and req.generator.device != probs.device:
            probs = probs.cpu()
        return int(torch.multinomial(probs, 1, generator=req.generator))
