"""ScheduledBatch: one step's work, made by the scheduler and run by the model runner (both import it here)."""

from __future__ import annotations

from dataclasses import dataclass

from radixchat.engine.request import Request


@dataclass(slots=True)
class ScheduledBatch:
    """What the scheduler decided for one step. Decode requests come first.

    For request ``i``: positions ``starts[i] .. starts[i] + num_new[i] - 1`` are fed, their K/V go to the
    slots already written into its table row, and it samples iff it reaches the end of its ids.
    """

    reqs: list[Request]
    starts: list[int]
    num_new: list[int]
    input_ids: list[int]
    n_decode: int

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def samples(self) -> list[bool]:
        return [s + n == r.total_len for r, s, n in zip(self.reqs, self.starts, self.num_new)]
