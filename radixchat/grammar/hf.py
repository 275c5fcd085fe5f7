"""Use a grammar with Hugging Face ``generate`` (reference loop for tests and benchmarks; the engine
has its own sampler and calls the matcher directly)."""

from __future__ import annotations

import torch


class GrammarLogitsProcessor:
    """A transformers ``LogitsProcessor`` for one sequence (batch size 1): advances the matcher with
    the token sampled at the previous step, then masks the scores.

    ``max_new_tokens`` turns on budget steering (the matcher is told how many tokens remain)."""

    def __init__(self, matcher, prompt_len: int, max_new_tokens: int | None = None) -> None:
        self.matcher = matcher
        self.prompt_len = prompt_len
        self.max_new_tokens = max_new_tokens
        self._seen = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[0] != 1:
            raise ValueError("GrammarLogitsProcessor handles one sequence")
        for tid in input_ids[0, self._seen :].tolist():
            self.matcher.advance(tid)
        self._seen = input_ids.shape[1]
        remaining = None
        if self.max_new_tokens is not None:
            remaining = self.max_new_tokens - (self._seen - self.prompt_len)
        mask = self.matcher.allowed(remaining)
        width = scores.shape[-1]
        if mask.shape[0] != width:
            raise ValueError(f"mask width {mask.shape[0]} != logits width {width}")
        return scores.masked_fill(~mask.to(scores.device), float("-inf"))


@torch.inference_mode()
def generate(
    model,
    input_ids: torch.Tensor,
    matcher=None,
    *,
    max_new_tokens: int,
    eos_ids=(),
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> list[int]:
    """A minimal decode loop (KV cache, batch 1) with an optional matcher: greedy when
    ``temperature == 0``, else sampling. Stops after an EOS id or ``max_new_tokens``. Returns the new ids
    (EOS included when one was produced)."""
    from transformers import DynamicCache

    eos = set(int(e) for e in eos_ids)
    out = model(input_ids, cache=DynamicCache(), use_cache=True)
    logits = out.logits[0, -1]
    new: list[int] = []
    for step in range(max_new_tokens):
        if matcher is not None:
            logits = logits.masked_fill(~matcher.allowed(max_new_tokens - step), float("-inf"))
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            tid = int(torch.multinomial(probs, 1, generator=generator))
        else:
            tid = int(torch.argmax(logits))
        if matcher is not None:
            matcher.advance(tid)
        new.append(tid)
        if tid in eos:
            break
        out = model(torch.tensor([[tid]]), cache=out.past_key_values, use_cache=True)
        logits = out.logits[0, -1]
    return new
