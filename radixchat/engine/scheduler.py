"""Continuous batching: admission, chunked prefill, eviction, retraction and release.

Each step the scheduler (1) drops cancelled requests, (2) makes room for every running decode (evicting
the tree's unlocked leaves first, then retracting the request with the fewest generated tokens),
(3) continues chunked prefills, and (4) admits waiting requests in longest-prefix-match order under a
token budget (``chunked_prefill_size``) and a memory budget (free + evictable slots, minus a reserve for
the running requests' growth). The result is one flattened batch: decode tokens first, then prefill
chunks. Slots for the step are allocated and written into the request table here, and ``kv_len`` is
advanced here, so the slots are always owned by someone.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import torch

from radixchat.engine.batch import ScheduledBatch
from radixchat.engine.kv_pool import KVPool, ReqToTokenTable
from radixchat.engine.prefix_cache import PrefixCache
from radixchat.engine.request import Event, FinishReason, Request
from radixchat.engine.stats import SchedulerCounters

if TYPE_CHECKING:
    from radixchat.engine.kvstore import KVTier

# Admission keeps room for running requests to grow by this share of their remaining max_tokens
# (SGLang's optimistic "new token ratio"): it decays while nothing is retracted and resets on retraction.
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = 0.001
RESERVE_CLIP = 4096
# Above this many waiting requests LPM ordering costs more than it saves (SGLang uses the same cut-off).
LPM_MAX_QUEUE = 128
# A waiting request whose uncached prompt shares at least this many tokens with one admitted in the
# same step waits a step, so it can reuse that one's KV instead of computing it twice.
IN_BATCH_PREFIX_MIN = 16


class Scheduler:
    def __init__(
        self,
        pool: KVPool,
        table: ReqToTokenTable,
        cache: PrefixCache,
        *,
        max_running: int,
        chunk_size: int,
        policy: str = "lpm",
        counters: SchedulerCounters | None = None,
        kv_tier: KVTier | None = None,
    ) -> None:
        self.pool = pool
        self.table = table
        self.cache = cache
        self.max_running = max_running
        self.chunk_size = chunk_size
        self.policy = policy
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: list[tuple[Request, Event]] = []  # ended since the last drain_finished()
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.counters = counters if counters is not None else SchedulerCounters()
        self.kv_tier = kv_tier  # the disk store: admission extends tree matches from it

    # -- queue ----------------------------------------------------------------------------------------

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def drain_finished(self) -> list[tuple[Request, Event]]:
        """The requests ended since the last call, with their finish events, in the order they ended."""
        out, self.finished = self.finished, []
        return out

    # -- one step -------------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        self._drop_cancelled()
        decodes = self._prepare_decodes()
        budget = self.chunk_size
        extends: list[tuple[Request, int]] = []
        for req in self.running:
            if req.extend_len > 1 and budget > 0:
                n = min(req.extend_len, budget)
                if self._alloc_for(req, n):
                    extends.append((req, n))
                    budget -= n
        if budget > 0:
            extends.extend(self._admit(budget))
        if not decodes and not extends:
            if self.running:  # every running prefill is stuck for memory: free some and retry next step
                self._retract(self._pick_victim(self.running))
            return None
        self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)

        reqs, starts, num_new, input_ids = [], [], [], []
        for req in decodes:
            start = req.kv_len - 1
            reqs.append(req)
            starts.append(start)
            num_new.append(1)
            input_ids.append(req.all_ids[start])
        for req, n in extends:
            start = req.kv_len - n
            ids = req.all_ids
            reqs.append(req)
            starts.append(start)
            num_new.append(n)
            input_ids.extend(ids[start : start + n])
        self.counters.computed_tokens += len(input_ids)
        return ScheduledBatch(reqs, starts, num_new, input_ids, len(decodes))

    def after_forward(self, batch: ScheduledBatch) -> None:
        """Publish every prefill chunk to the tree at once, so requests admitted later (and retries)
        share it instead of computing it again. Decode tokens are published when the request ends."""
        for req in batch.reqs[batch.n_decode :]:
            if not req.finished and req.row >= 0:
                self.cache.cache_unfinished_req(req, self.table)

    # -- decode room ----------------------------------------------------------------------------------

    def _prepare_decodes(self) -> list[Request]:
        while True:
            decodes = [r for r in self.running if r.extend_len == 1]
            if not decodes:
                return []
            shortfall = len(decodes) - self.pool.num_free
            if shortfall > 0 and self.cache.evictable_size > 0:
                self.counters.evicted_tokens += self.cache.evict(shortfall)
                continue
            if shortfall <= 0:
                break
            if len(self.running) == 1:
                # Nothing left to evict or retract: this request alone has filled the pool.
                req = self.running[0]
                self.finish(req, FinishReason.LENGTH)
                continue
            self._retract(self._pick_victim(self.running))
        for req in decodes:
            slots = self.pool.alloc(1)
            assert slots is not None
            self.table.write(req.row, req.kv_len, slots)
            req.kv_len += 1
        return decodes

    @staticmethod
    def _pick_victim(candidates: list[Request]) -> Request:
        # Fewest generated tokens first (least work lost); among equals, the newest request.
        return min(candidates, key=lambda r: (len(r.output_ids), -r.rid))

    def _retract(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        self.waiting.appendleft(req)
        self.counters.retractions += 1
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO

    # -- admission ------------------------------------------------------------------------------------

    def _reserve(self, req: Request) -> int:
        left = min(req.params.max_tokens, req.max_total_len - len(req.prompt_ids)) - len(req.output_ids)
        return int(min(max(left, 0), RESERVE_CLIP) * self.new_token_ratio)

    def _order_waiting(self) -> list[Request]:
        if self.policy == "lpm" and len(self.waiting) <= LPM_MAX_QUEUE:
            scored = [(self.cache.prefix_len(r.all_ids[:-1]), i, r) for i, r in enumerate(self.waiting)]
            scored.sort(key=lambda t: (-t[0], t[1]))
            return [r for _, _, r in scored]
        return list(self.waiting)

    def _admit(self, budget: int) -> list[tuple[Request, int]]:
        admitted: list[tuple[Request, int]] = []
        reserved = sum(self._reserve(r) for r in self.running)
        for req in self._order_waiting():
            if budget <= 0 or len(self.running) >= self.max_running or self.table.num_free == 0:
                break
            ids = req.all_ids
            match = self.cache.match_prefix(ids[:-1])
            if self.kv_tier is not None:
                match = self.kv_tier.extend_match(ids[:-1], match)
            match_len = match.length
            if self._shares_uncached_prefix(ids, match_len, admitted):
                continue
            n = min(len(ids) - match_len, budget)
            self.cache.lock(match.node)
            available = self.pool.num_free + self.cache.evictable_size - reserved
            if n + self._reserve(req) > available and (self.running or admitted):
                self.cache.unlock(match.node)
                break
            req.row = self.table.alloc()
            req.last_node = match.node
            self.table.write(req.row, 0, match.slots)
            req.cache_len = req.kv_len = match_len
            if not self._alloc_for(req, n):
                self._release(req)  # even evicting everything unlocked is not enough; try later
                break
            if req.cached_tokens is None:
                req.cached_tokens = min(match_len, len(req.prompt_ids))
                if not req.warmup:
                    self.counters.prompt_tokens += len(req.prompt_ids)
                    self.counters.cached_tokens += req.cached_tokens
            self.waiting.remove(req)
            self.running.append(req)
            admitted.append((req, n))
            reserved += self._reserve(req)
            budget -= n
        return admitted

    def _shares_uncached_prefix(
        self, ids: list[int], match_len: int, admitted: list[tuple[Request, int]]
    ) -> bool:
        for other, _ in admitted:
            if self.cache.shared_prefix_len(ids, other.all_ids) - match_len >= IN_BATCH_PREFIX_MIN:
                return True
        return False

    def _alloc_for(self, req: Request, n: int) -> bool:
        """Give ``req`` ``n`` new slots at positions kv_len.. (evicting if needed) and advance kv_len."""
        if self.pool.num_free < n and self.cache.evictable_size > 0:
            self.counters.evicted_tokens += self.cache.evict(n - self.pool.num_free)
        slots = self.pool.alloc(n)
        if slots is None:
            return False
        self.table.write(req.row, req.kv_len, slots)
        req.kv_len += n
        return True

    # -- release --------------------------------------------------------------------------------------

    def _release(self, req: Request, insert: bool = True) -> None:
        """Give back everything a running request holds; its computed KV goes to the tree."""
        if req.row < 0:
            return
        if insert and req.kv_len > 0:
            self.cache.cache_finished_req(req, self.table)
        else:
            self.pool.free(self.table.read(req.row, req.cache_len, req.kv_len))
        if req.last_node is not None:
            self.cache.unlock(req.last_node)
        self.table.free(req.row)
        req.row = -1
        req.last_node = None
        req.kv_len = req.cache_len = 0

    def finish(
        self, req: Request, reason: FinishReason, error: str | None = None, insert: bool = True
    ) -> None:
        """The one place a request ends, whoever ends it (the core after sampling; cancellation, a full
        pool or an engine error here): it leaves the queues, a running request's KV goes to the cache
        (``insert``) or is freed, the reason is set, and its finish event waits in ``finished``."""
        req.finish_reason = reason
        req.error = error
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req, insert=insert)
        self.finished.append((req, req.finish_event()))

    def _drop_cancelled(self) -> None:
        for req in [r for r in self.waiting if r.cancelled]:
            self.finish(req, FinishReason.CANCELLED)
        for req in [r for r in self.running if r.cancelled]:
            self.finish(req, FinishReason.CANCELLED)

    def abort_all(self, error: str) -> None:
        """Fail every request (after an engine error); KV computed in a failed step is not trusted."""
        for req in list(self.running):
            self.finish(req, FinishReason.ERROR, error, insert=False)
        for req in list(self.waiting):
            self.finish(req, FinishReason.ERROR, error, insert=False)

    # -- invariants -----------------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """free + tree-owned + private-to-running == capacity, with no slot counted twice."""
        self.cache.check_integrity()
        free = self.pool.free_set()
        tree = self.cache.owned_slots()
        private: list[int] = []
        for req in self.running:
            assert req.row >= 0 and 0 <= req.cache_len <= req.kv_len <= req.total_len, req
            private.extend(self.table.read(req.row, req.cache_len, req.kv_len).tolist())
            if req.cache_len:
                assert req.last_node is not None
                expect = self.cache.peek(req.all_ids[: req.cache_len])
                got = self.table.read(req.row, 0, req.cache_len)
                assert torch.equal(expect, got), f"request {req.rid} points at slots the tree does not own"
        for req in self.waiting:
            assert req.row < 0 and req.kv_len == 0, req
        owned = len(free) + len(tree) + len(private)
        assert len(set(tree) | set(private) | free) == owned, "a slot is owned twice"
        assert owned == self.pool.capacity, f"{owned} slots accounted for, pool has {self.pool.capacity}"
        assert 0 not in free and 0 not in tree and 0 not in private
