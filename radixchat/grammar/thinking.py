"""A grammar that starts after the thinking: JSON and tool modes constrain the answer, not the reasoning.

``ThinkingMatcher`` wraps any matcher (the engine's ``TokenMatcher`` protocol). While the model thinks,
every token but an end of sequence passes (one mask built once per reply: no grammar work per token); once
the closing tag is generated, the wrapped matcher takes over for the answer. The thinking has a cap:
``max_thinking`` tokens, and never more than half of the reply's token budget, so that the answer always
has room; at the cap the closing tag is the only token allowed. A reply that does not open the tag first
is constrained from its first token, as without thinking.

The tags must be single tokens of the vocabulary (as in Qwen3 and the R1 distills); the chat layer uses
the wrapped matcher alone for a vocabulary without them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

_UNDECIDED, _THINKING, _ANSWER = range(3)


class ThinkingMatcher:
    __slots__ = (
        "inner",
        "budget_limited",
        "thought",
        "_state",
        "_vocab",
        "_open",
        "_close",
        "_eos",
        "_max",
        "_cap",
        "_free",
        "_forced",
    )

    def __init__(
        self,
        inner: Any,
        vocab_size: int,
        open_id: int,
        close_id: int,
        eos_ids: Iterable[int],
        max_thinking: int,
        inside: bool = False,
    ) -> None:
        """``inside``: the prompt already opened the thinking (its generation prompt ends with the tag)."""
        self.inner = inner
        self.budget_limited = False
        self.thought = 0  # tokens generated inside the thinking (the closing tag included)
        self._state = _THINKING if inside else _UNDECIDED
        self._vocab = vocab_size
        self._open, self._close = open_id, close_id
        self._eos = [e for e in eos_ids if e < vocab_size]
        self._max = max_thinking
        self._cap: int | None = None  # fixed at the first thinking step, from the budget left then
        self._free: torch.Tensor | None = None
        self._forced: torch.Tensor | None = None

    @property
    def thinking(self) -> bool:
        return self._state == _THINKING

    def allowed(self, remaining: int | None = None) -> torch.Tensor:
        if self._state == _ANSWER:
            mask = self.inner.allowed(remaining)
            self.budget_limited = self.inner.budget_limited
            return mask
        self.budget_limited = False
        if self._state == _UNDECIDED:  # the answer's first token, or the opening tag
            mask = self.inner.allowed(remaining).clone()
            mask[self._open] = True
            return mask
        if self._cap is None:
            self._cap = self._max if remaining is None else min(self._max, remaining // 2)
        if self.thought >= self._cap:
            if self._forced is None:
                self._forced = torch.zeros(self._vocab, dtype=torch.bool)
                self._forced[self._close] = True
            return self._forced
        if self._free is None:
            self._free = torch.ones(self._vocab, dtype=torch.bool)
            self._free[self._eos] = False  # the reply cannot end before its answer
        return self._free

    def advance(self, token_id: int) -> None:
        if self._state == _UNDECIDED:
            if token_id == self._open:
                self._state = _THINKING
                return
            self._state = _ANSWER
        if self._state == _THINKING:
            self.thought += 1
            if token_id == self._close:
                self._state = _ANSWER
            return
        self.inner.advance(token_id)

    def is_accepting(self) -> bool:
        return self._state == _ANSWER and self.inner.is_accepting()

    def is_terminated(self) -> bool:
        return self._state == _ANSWER and self.inner.is_terminated()
