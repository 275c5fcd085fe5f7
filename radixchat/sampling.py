"""How to pick tokens and when to stop: the engine's sampling parameters.

Plain data with its own validation and no torch, so that the chat layer, batch mode and the remote
backend can build them without loading the engine (``radixchat.engine`` re-exports the class).
"""

from __future__ import annotations

from dataclasses import dataclass

from radixchat.errors import RequestError

MIN_PENALTY, MAX_PENALTY = 0.01, 100.0  # beyond these, dividing logits by the penalty overflows
MAX_SEED = 2**63 - 1  # torch generators take a 64-bit seed


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens and when to stop. ``temperature == 0`` is greedy."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            problems.append(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= 100.0:
            problems.append(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            problems.append(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if not MIN_PENALTY <= self.repetition_penalty <= MAX_PENALTY:
            problems.append(
                f"repetition_penalty must be in [{MIN_PENALTY}, {MAX_PENALTY}], got {self.repetition_penalty!r}"
            )
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED):
            problems.append(f"seed must be an integer in [0, 2**63 - 1], got {self.seed!r}")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            problems.append("stop must be a list of non-empty strings")
        if problems:
            raise RequestError("invalid sampling parameters: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
