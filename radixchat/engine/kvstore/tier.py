"""Moving KV between the KV pool + radix tree and the disk store.

- **Load**: the longest stored continuation of a token path past what the tree holds is read, verified,
  copied into newly allocated pool slots and inserted into the tree, exactly as a prefill's KV would
  be. The slots are tree-owned from then on (the integrity invariant free + tree + private == pool is
  unchanged), and the new node is marked ``from_disk``. A bad block stops the load there with a notice;
  the rest is computed as if nothing had been stored.
- **Save**: an owner's path is the longest prefix of its ids whose KV is in the tree or already stored;
  blocks not stored yet are encoded from the pool and written durably, then the owner's record.
- **Spill** (``spill.py``): with spilling on, a leaf the tree evicts is written to the store before its
  slots are freed, and comes back through the load path.

Everything that touches tensors, the pool or the tree runs on the engine's thread under its state lock;
``save`` and ``load`` take a ``run`` function that gets them there (``Engine`` passes its ``call``), and
read and write files on the calling thread in between, so disk I/O does not stall the engine's steps.
The tree node a save or load works on stays locked until it is done, so its slots cannot be evicted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from radixchat.engine.kv_pool import KVPool
from radixchat.engine.kvstore.blocks import BLOCK_TOKENS, BadBlock, BlockInfo, chain_key, kv_tensor
from radixchat.engine.kvstore.files import describe_os_error
from radixchat.engine.kvstore.spill import HEADER_BYTES, Spiller, encode_slots
from radixchat.engine.kvstore.store import KVStore
from radixchat.engine.prefix_cache import MatchResult
from radixchat.engine.radix_cache import RadixCache
from radixchat.engine.stats import SchedulerCounters
from radixchat.engine.tree_node import TreeNode

log = logging.getLogger(__name__)

# A lookup on admission loads at least this many tokens (fewer are cheaper to compute than to read).
MIN_LOAD_TOKENS = 16
# Bytes of blocks encoded (saving) or read (loading) per trip to the engine's thread: bounds the
# memory a long session takes besides its pool slots.
SAVE_GROUP_BYTES = 32 << 20
LOAD_GROUP_BYTES = 64 << 20

Run = Callable[..., Any]  # run(fn, *args): fn(*args) on the engine's thread, under its state lock


def _direct(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


@dataclass(frozen=True, slots=True)
class KVLoadResult:
    cached_tokens: int  # tokens of the path that were in the pool already
    loaded_tokens: int  # tokens loaded from disk now
    notices: tuple[str, ...] = ()  # one line per bad block found (ignored; its tokens are recomputed)

    @property
    def warm_tokens(self) -> int:
        return self.cached_tokens + self.loaded_tokens


@dataclass(frozen=True, slots=True)
class KVSaveResult:
    owner: str
    tokens: int  # tokens of the path now stored for the owner (0: nothing)
    written_bytes: int  # bytes written by this save (blocks already stored are shared, not rewritten)
    notice: str | None = None  # why not everything was saved (disk full, budget, store off)


@dataclass(slots=True)
class _Load:
    ids: list[int]
    node: TreeNode  # locked while the load runs
    tree_slots: torch.Tensor  # the tree's slots of ids[:have]
    blocks: list[tuple[BlockInfo, int, int]]  # (block, lo, hi): positions start+lo .. start+hi-1

    @property
    def have(self) -> int:
        return int(self.tree_slots.numel())


@dataclass(slots=True)
class _Block:
    key: str
    parent: str
    start: int
    ids: Sequence[int]
    slots: torch.Tensor | None  # pool slots to encode it from; None: already stored


@dataclass(slots=True)
class _Save:
    node: TreeNode  # locked while the save runs
    blocks: list[_Block]

    @property
    def tokens(self) -> int:
        return self.blocks[-1].start + len(self.blocks[-1].ids) if self.blocks else 0


class KVTier:
    """Loads and saves KV between the pool + tree and ``store``; ``spiller`` is the tree's ``on_evict``
    when spilling is on (the core builds it first, since the tree is built with it)."""

    def __init__(
        self,
        store: KVStore,
        pool: KVPool,
        cache: RadixCache,
        counters: SchedulerCounters,
        spiller: Spiller | None = None,
    ) -> None:
        self.store = store
        self.pool = pool
        self.cache = cache
        self.counters = counters  # loaded_tokens, evicted_tokens
        self.spiller = spiller
        self.load_disk_s = 0.0  # engine-thread time spent loading during steps

    @property
    def step_disk_s(self) -> float:
        """Engine-thread time spent on the disk during steps: loading on admission, spilling on eviction."""
        return self.load_disk_s + (self.spiller.disk_s if self.spiller is not None else 0.0)

    @property
    def block_bytes_per_token(self) -> int:
        return self.pool.shape.bytes_per_token

    # -- load -----------------------------------------------------------------------------------------

    def load(self, ids: Sequence[int], run: Run = _direct) -> KVLoadResult:
        """Load the longest stored continuation of ``ids`` past the tree into the pool and the tree.

        Blocks are read and copied in groups of at most ``LOAD_GROUP_BYTES``, so a long session never
        sits in memory twice (as files read and as pool slots)."""
        ids = list(ids)
        cached: int | None = None  # what the tree held before the first group
        loaded = 0
        notices: list[str] = []
        while True:
            plan = run(self._plan_load, ids)
            if not isinstance(plan, _Load):
                return KVLoadResult(plan if cached is None else cached, loaded, tuple(notices))
            planned = len(plan.blocks)
            try:
                checked, bad = self._read(plan)
            except BaseException:
                run(self.cache.unlock, plan.node)
                raise
            res = run(self._apply_load, plan, checked)
            notices += bad
            cached = res.cached_tokens if cached is None else cached
            loaded += res.loaded_tokens
            if bad or res.loaded_tokens == 0 or len(checked) < planned:
                return KVLoadResult(cached, loaded, tuple(notices))

    def extend_match(self, ids: list[int], match: MatchResult) -> MatchResult:
        """On admission (engine thread): extend a tree match with what the store holds past it."""
        if len(ids) - match.length < MIN_LOAD_TOKENS:
            return match
        self.store.refresh()
        if not self.store.num_blocks:
            return match
        blocks = self.store.lookup(ids, match.length)
        if not blocks or blocks[-1][0].start + blocks[-1][2] - match.length < MIN_LOAD_TOKENS:
            return match
        started = time.perf_counter()
        try:
            self.load(ids)
        except Exception:  # a bug here must cost a prefill, not the step (and every request in it)
            log.exception("loading KV from the store failed; computing it instead")
        self.load_disk_s += time.perf_counter() - started
        return self.cache.match_prefix(ids)

    def _plan_load(self, ids: list[int]) -> _Load | int:
        """Lock the tree's match of ``ids`` and plan the next group of stored blocks past it."""
        match = self.cache.match_prefix(ids)
        self.store.refresh()
        blocks = self.store.lookup(ids, match.length)
        if not blocks:
            return match.length
        size, n = 0, 0
        while n < len(blocks) and (n == 0 or size + blocks[n][0].nbytes <= LOAD_GROUP_BYTES):
            size += blocks[n][0].nbytes
            n += 1
        self.cache.lock(match.node)
        return _Load(ids, match.node, match.slots, blocks[:n])

    def _read(self, plan: _Load) -> tuple[list[tuple[bytearray, tuple[int, int]]], list[str]]:
        """Read and verify the planned blocks (no torch: any thread). Stops at the first bad one."""
        out: list[tuple[bytearray, tuple[int, int]]] = []
        notices: list[str] = []
        for info, _, _ in plan.blocks:
            try:
                data = self.store.read(info)
                out.append((data, self.store.check(data, info)))
            except FileNotFoundError:
                break  # deleted meanwhile (budget, another process): compute the rest
            except BadBlock as exc:
                notices.append(self.store.discard(info, str(exc)))
                break
            except OSError as exc:
                notices.append(self.store.notice(f"KV store: cannot read a block: {describe_os_error(exc)}"))
                break
        return out, notices

    def _apply_load(self, plan: _Load, checked: list[tuple[bytearray, tuple[int, int]]]) -> KVLoadResult:
        have = plan.have
        try:
            parts = [(info, lo, hi, data, span) for (info, lo, hi), (data, span) in zip(plan.blocks, checked)]
            room = self.pool.num_free + self.cache.evictable_size  # plan.node is locked: not counted
            need = 0
            for i, (_, lo, hi, _, _) in enumerate(parts):
                if need + hi - lo > room:
                    parts = parts[:i]
                    break
                need += hi - lo
            if need == 0:
                return KVLoadResult(have, 0)
            if self.pool.num_free < need:
                self.counters.evicted_tokens += self.cache.evict(need - self.pool.num_free)
            slots = self.pool.alloc(need)
            if slots is None:  # evicting could not make room after all: compute instead
                return KVLoadResult(have, 0)
            dst = torch.tensor(slots, dtype=torch.int64)
            off = 0
            for info, lo, hi, data, span in parts:
                kv = kv_tensor(data, span, self.store.expect, len(info.ids))[:, :, lo:hi].to(self.pool.device)
                idx = dst[off : off + hi - lo].to(self.pool.device)
                for layer in range(self.pool.shape.num_layers):
                    self.pool.k[layer].index_copy_(0, idx, kv[layer, 0])
                    self.pool.v[layer].index_copy_(0, idx, kv[layer, 1])
                off += hi - lo
            end = have + need
            res = self.cache.insert(plan.ids[:end], torch.cat((plan.tree_slots, dst)))
            if res.prefix_len > have:  # the tree grew meanwhile (another request): ours are duplicates
                self.pool.free(dst[: min(res.prefix_len, end) - have])
            if res.prefix_len < end:
                res.node.from_disk = True
            loaded = max(end - res.prefix_len, 0)
            self.counters.loaded_tokens += loaded
            return KVLoadResult(have, loaded)
        finally:
            self.cache.unlock(plan.node)

    # -- save -----------------------------------------------------------------------------------------

    def save(self, ids: Sequence[int], owner: str, run: Run = _direct) -> KVSaveResult:
        """Store ``owner``'s path: the longest prefix of ``ids`` whose KV is in the tree or stored.

        Never raises for disk errors: a full disk or an unwritable directory is a notice, and the owner
        keeps the blocks that were written (its record is updated only if every block is on disk)."""
        plan: _Save = run(self._plan_save, list(ids))
        written = 0
        try:
            blocks, notice = self._fit_budget(plan, owner)
            todo = [b for b in blocks if b.slots is not None]
            group: list[_Block] = []
            size = 0
            for i, b in enumerate(todo):
                group.append(b)
                size += len(b.ids) * self.block_bytes_per_token
                if size < SAVE_GROUP_BYTES and i + 1 < len(todo):
                    continue
                for blk, data in zip(group, run(self._encode, group)):
                    self.store.write(blk.key, blk.parent, blk.start, blk.ids, data, durable=True)
                    written += len(data)
                group, size = [], 0
            if blocks:
                self.store.set_owner(owner, [b.key for b in blocks], _Save(plan.node, blocks).tokens)
            return KVSaveResult(owner, _Save(plan.node, blocks).tokens, written, notice)
        except OSError as exc:
            note = self.store.notice(f"KV store: the KV of '{owner}' was not saved: {describe_os_error(exc)}")
            return KVSaveResult(owner, 0, written, note)
        finally:
            run(self.cache.unlock, plan.node)

    def _plan_save(self, ids: list[int]) -> _Save:
        match = self.cache.match_prefix(ids)
        have = match.length
        self.store.refresh()
        more = self.store.lookup(ids, have)
        end = more[-1][0].start + more[-1][2] if more else have
        blocks: list[_Block] = []
        parent = self.store.root_key
        for start in range(0, end, BLOCK_TOKENS):
            seg = ids[start : min(start + BLOCK_TOKENS, end)]
            found = self.store.find(parent, seg)
            if found is not None:
                blocks.append(_Block(found.key, parent, start, seg, None))
            elif start + len(seg) <= have:
                slots = match.slots[start : start + len(seg)]
                blocks.append(_Block(chain_key(parent, seg), parent, start, seg, slots))
            else:
                break
            parent = blocks[-1].key
        self.cache.lock(match.node)
        return _Save(match.node, blocks)

    def _fit_budget(self, plan: _Save, owner: str) -> tuple[list[_Block], str | None]:
        """Cut the path to what the budget can hold and make room for its new blocks."""
        per_token = self.block_bytes_per_token
        blocks, total = [], 0
        for b in plan.blocks:
            total += len(b.ids) * per_token + HEADER_BYTES
            if total > self.store.budget_bytes:
                break
            blocks.append(b)
        notice = None
        if len(blocks) < len(plan.blocks):
            tokens = _Save(plan.node, blocks).tokens
            notice = self.store.notice(
                f"KV store: kept the first {tokens} of {plan.tokens} tokens within the "
                f"{self.store.budget_bytes / 2**30:.2g} GiB budget (--kv-store-gib)"
            )
        need = sum(len(b.ids) * per_token + HEADER_BYTES for b in blocks if b.slots is not None)
        self.store.make_room(need, protect=[b.key for b in blocks], saving=owner)
        return blocks, notice

    def _encode(self, blocks: list[_Block]) -> list[bytes]:
        return [encode_slots(self.pool, self.store, b.key, b.parent, b.start, b.ids, b.slots) for b in blocks]  # type: ignore[arg-type]
