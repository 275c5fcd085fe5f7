"""How often a streaming reply is redrawn: as often as the UI thread can afford.

Every write of a streaming reply costs the app's thread a frame or two: Textual lays the screen out again
(the reply grew) and re-renders every widget that moved. That thread shares the GIL and the cores with
the local engine, so each millisecond it spends is about a millisecond the engine does not decode (issue
11). A fixed rate is wrong on both sides: smooth and nearly free on a fast machine, a large share of the
decode speed on a slow one. So the pace is measured: after each write, the next waits
until the app thread's CPU time since the previous write is at most ``share`` of the wall time, within
``[fastest, slowest]`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FASTEST = 1 / 5  # seconds: never more than five writes a second (smooth enough to read as it comes)
SLOWEST = 1.0  # seconds: never less than one (the reply must visibly move)
SHARE = 0.03  # of one core: the app thread's budget while a reply streams


class WritePacer:
    """Decides when a streaming view writes next. Create it, and use it, on the app's (event-loop) thread:
    ``time.thread_time`` measures the calling thread, which is the one that renders."""

    def __init__(
        self,
        fastest: float = FASTEST,
        slowest: float = SLOWEST,
        share: float = SHARE,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        if not 0 < fastest <= slowest or not 0 < share <= 1:
            raise ValueError(f"bad pacing: fastest={fastest}, slowest={slowest}, share={share}")
        self.fastest, self.slowest, self.share = fastest, slowest, share
        self._clock, self._cpu = clock, cpu
        self.interval = fastest  # the wait after the last write
        self._wall = self._cpu_at = None  # when (wall, this thread's CPU) the last write went out
        self._next = 0.0  # the first write goes out at once

    def due(self) -> bool:
        return self._clock() >= self._next

    def wrote(self) -> None:
        """A write went out now: set the wait before the next from what the last period cost."""
        wall, cpu = self._clock(), self._cpu()
        if self._wall is not None:
            self.interval = self.next_interval(cpu - self._cpu_at, wall - self._wall)
        self._wall, self._cpu_at = wall, cpu
        self._next = wall + self.interval

    def next_interval(self, cpu_spent: float, wall_spent: float) -> float:
        """The wait that would have kept the last period's CPU (``cpu_spent`` over ``wall_spent``) at
        ``share``; the frames a write causes land after it, so each period pays for the write before."""
        if wall_spent <= 0:
            return self.interval
        return min(self.slowest, max(self.fastest, cpu_spent / self.share))
