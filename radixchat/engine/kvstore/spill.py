"""Spilling: KV the radix tree evicts from the pool is written to the disk store before its slots are freed.

The tree calls ``Spiller.spill`` (its ``on_evict``) with each leaf it evicts, while the leaf's whole path is
still in the tree. Blocks are written not durably: the store is a cache, and a torn file fails its
checksum. What was spilled comes back through the tier's load path (``tier.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from radixchat.engine.kv_pool import KVPool
from radixchat.engine.kvstore.blocks import BLOCK_TOKENS, chain_key, encode, full_block_keys
from radixchat.engine.kvstore.files import describe_os_error
from radixchat.engine.kvstore.store import KVStore
from radixchat.engine.stats import SchedulerCounters
from radixchat.engine.tree_node import TreeNode

log = logging.getLogger(__name__)

HEADER_BYTES = 4096  # a generous estimate of a block file's header (the ids are in it)


def encode_slots(
    pool: KVPool, store: KVStore, key: str, parent: str, start: int, ids: Sequence[int], slots: torch.Tensor
) -> bytes:
    """One block file's bytes, from the K/V of ``slots`` in ``pool`` (engine thread)."""
    idx = slots.to(pool.device)
    kv = torch.stack([torch.stack((k[idx], v[idx])) for k, v in zip(pool.k, pool.v)])
    return encode(
        kv.cpu().contiguous(),
        fingerprint=store.expect.fingerprint,
        key=key,
        parent=parent,
        start=start,
        ids=ids,
    )


class Spiller:
    def __init__(self, store: KVStore, pool: KVPool, counters: SchedulerCounters) -> None:
        self.store = store
        self.pool = pool
        self.counters = counters  # spilled_tokens
        self.failed = False
        self._full_at = -1  # store size at which spilling last found no room (-1: it had room)
        self.disk_s = 0.0  # engine-thread time spent spilling during steps

    def spill(self, leaf: TreeNode) -> None:
        """Write an evicted leaf's blocks that the store does not hold yet (engine thread, in evict)."""
        if self.failed or 0 <= self._full_at <= self.store.total_bytes:
            return  # the disk failed, or the store is full of saved paths (spills never evict those)
        self._full_at = -1
        started = time.perf_counter()
        try:
            self._spill(leaf)
        except Exception:  # a bug here must not fail the step that is evicting
            self.failed = True
            log.exception("spilling KV to the store failed; spilling is off for this run")
        finally:
            self.disk_s += time.perf_counter() - started

    def _encode(self, key: str, parent: str, start: int, ids: Sequence[int], slots: torch.Tensor) -> bytes:
        return encode_slots(self.pool, self.store, key, parent, start, ids, slots)

    def _spill(self, leaf: TreeNode) -> None:
        nodes = []
        node: TreeNode | None = leaf
        while node is not None and node.parent is not None:  # up to the root, the one node without a parent
            nodes.append(node)
            node = node.parent
        ids = [t for n in reversed(nodes) for t in n.key]
        slots = torch.cat([n.value for n in reversed(nodes)])
        end = len(ids)
        first = (end - len(leaf)) // BLOCK_TOKENS
        parent = full_block_keys(self.store.root_key, ids, first)[-1] if first else self.store.root_key
        bytes_per_token = self.pool.shape.bytes_per_token
        for start in range(first * BLOCK_TOKENS, end, BLOCK_TOKENS):
            seg = ids[start : start + BLOCK_TOKENS]
            key = chain_key(parent, seg)
            if self.store.find(parent, seg) is None:
                size = len(seg) * bytes_per_token + HEADER_BYTES
                if not self.store.make_room(size, evict_owners=False):
                    self._full_at = self.store.total_bytes
                    return
                data = self._encode(key, parent, start, seg, slots[start : start + len(seg)])
                try:
                    self.store.write(key, parent, start, seg, data, durable=False)
                except OSError as exc:
                    self.failed = True
                    self.store.notice(f"KV store: spilling to disk stopped: {describe_os_error(exc)}")
                    return
                self.counters.spilled_tokens += len(seg)
            parent = key
