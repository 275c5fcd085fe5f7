"""Requests, their sampling parameters, and the events they stream back.

A request's token positions fall into regions (``all_ids = prompt_ids + output_ids``)::

    0 ........ cache_len ........ kv_len .............. len(all_ids)
    | tree-owned |   private KV    |  no KV yet (to feed) |
      (locked)      (freed/inserted
                     at release)

``kv_len`` tokens have K/V in the pool. The first ``cache_len`` of them are owned by the radix tree and
pinned by locking ``last_node``; the rest are private to the request. When the request is released
(finished, cancelled or retracted) its KV prefix is inserted into the tree, which adopts what it did not
already hold, and the request's duplicates are freed. The last sampled token never has KV.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from radixchat.errors import RequestError
from radixchat.sampling import SamplingParams  # torch-free, so the chat layer builds them without torch

if TYPE_CHECKING:
    from radixchat.engine.tree_node import TreeNode


@runtime_checkable
class TokenMatcher(Protocol):
    """What the sampler needs from a grammar (``radixchat.grammar`` provides one; the engine never
    imports it)."""

    #: True when the last ``allowed(remaining)`` removed tokens only because the budget ran low: an EOS
    #: taken then ends an output the model was not done with (the engine reports ``length``).
    budget_limited: bool

    def allowed(self, remaining: int | None = None) -> torch.Tensor:
        """Bool mask ``[vocab_size]`` on CPU; ``remaining`` tokens may still be generated (incl. EOS)."""
        ...

    def advance(self, token_id: int) -> None: ...

    def is_accepting(self) -> bool: ...

    def is_terminated(self) -> bool: ...


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop string, or the grammar is complete
    LENGTH = "length"  # max_tokens, the model's context, or the KV pool
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the radix tree (counted once per request)
    completion_tokens: int

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_id: int
    text: str  # newly complete text ("" while a UTF-8 character or a possible stop string is pending)


@dataclass(frozen=True, slots=True)
class FinishEvent:
    reason: FinishReason
    text: str  # any text held back until the end
    usage: Usage
    ttft_s: float | None  # submit -> first token
    decode_tokens_per_s: float | None  # tokens after the first, per second
    error: str | None = None


Event = TokenEvent | FinishEvent


@dataclass(slots=True, eq=False)
class Request:
    """Engine-side state of one generation. Owned by the engine thread."""

    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    matcher: TokenMatcher | None = None
    max_total_len: int = 0  # the model's context limit for prompt + output
    output_ids: list[int] = field(default_factory=list)

    # KV state (see the module docstring)
    kv_len: int = 0
    cache_len: int = 0
    last_node: TreeNode | None = None
    row: int = -1  # row in the request->slot table while running

    cached_tokens: int | None = None  # set at first admission
    finish_reason: FinishReason | None = None
    error: str | None = None
    cancelled: bool = False
    generator: torch.Generator | None = None
    detok: Any = None  # the detokenizer, set by the engine
    warmup: bool = False  # a background prefill: not counted in hit-rate statistics
    # The grammar allowed only an ending because the budget ran low, while the model preferred to go on:
    # an EOS sampled then cuts the output short (finish_reason length, not stop). Set by the sampler.
    budget_cut: bool = False
    # The repetition penalty's distinct ids so far (the sampler's, kept as the output grows): (prompt length,
    # output length, their set, the same as a tensor).
    penalty_ids: tuple[int, int, set[int], torch.Tensor] | None = None

    submitted_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def extend_len(self) -> int:
        """Tokens that still need KV before the next sample."""
        return self.total_len - self.kv_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def finish_event(self) -> FinishEvent:
        """The event that ends this request's stream (flushes the text the detokenizer held back)."""
        ttft, tps = self.timings()
        tail = self.detok.flush() if self.detok is not None else ""
        assert self.finish_reason is not None
        return FinishEvent(self.finish_reason, tail, self.usage(), ttft, tps, self.error)

    def usage(self) -> Usage:
        return Usage(len(self.prompt_ids), self.cached_tokens or 0, len(self.output_ids))

    def timings(self) -> tuple[float | None, float | None]:
        ttft = None if self.first_token_at is None else self.first_token_at - self.submitted_at
        tps = None
        n = len(self.output_ids)
        if self.first_token_at is not None and self.last_token_at is not None and n > 1:
            dt = self.last_token_at - self.first_token_at
            tps = (n - 1) / dt if dt > 0 else None
        return ttft, tps


def validate_prompt(prompt_ids: Sequence[int], vocab_size: int) -> list[int]:
    ids = list(prompt_ids)
    if not ids:
        raise RequestError("empty prompt: at least one token is needed")
    bad = next((t for t in ids if not isinstance(t, int) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RequestError(f"prompt token {bad!r} is outside the vocabulary (0..{vocab_size - 1})")
    return ids
