"""The radix tree: a compressed trie over token ids whose nodes own KV-pool slots (a ``PrefixCache``).

Contracts (the scheduler relies on every one of them; ``prefix_cache.py`` states the interface's):

- ``match_prefix(ids)`` returns the slots of the longest cached prefix of ``ids`` and the node where it
  ends (splitting a node if the match ends inside it, so the node's path is exactly the match). The slots
  are safe to use only while that node is locked.
- ``lock(node)`` / ``unlock(node)`` walk to the root; a node whose ``lock_ref`` crosses 0<->1 moves its
  tokens between ``evictable_size`` and ``protected_size``. Locked nodes are never evicted.
- ``insert(ids, slots)`` returns how many leading tokens were already cached. The tree adopts
  ``slots[prefix_len:]``; the caller still owns ``slots[:prefix_len]`` and must free those that are not
  the tree's own (they are duplicates) and then point at the tree's slots instead.
- ``evict(n)`` frees unlocked leaves in LRU order, cascading to parents that become unlocked leaves, until
  at least ``n`` tokens are freed or nothing evictable is left. It may free more than asked.
- Splitting a node copies its ``lock_ref`` to the new parent (every lock that covered the old node's path
  also covers the new parent).
- ``on_evict``, when given, is called with each leaf just before its slots are freed (its whole path is
  still in the tree then), so the KV store can spill it to disk.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from radixchat.engine.kv_pool import KVPool, ReqToTokenTable
from radixchat.engine.prefix_cache import EMPTY_SLOTS as _EMPTY
from radixchat.engine.prefix_cache import InsertResult, MatchResult, NodeInfo, PrefixCache
from radixchat.engine.tree_node import TreeNode

if TYPE_CHECKING:
    from radixchat.engine.request import Request


def common_prefix_len(a: Sequence[int], a_start: int, b: Sequence[int]) -> int:
    """Length of the common prefix of ``a[a_start:]`` and ``b``."""
    n = min(len(a) - a_start, len(b))
    i = 0
    while i < n and a[a_start + i] == b[i]:
        i += 1
    return i


class RadixCache(PrefixCache):
    def __init__(self, pool: KVPool, on_evict: Callable[[TreeNode], None] | None = None) -> None:
        self.pool = pool
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self.root = TreeNode(0, [], _EMPTY, None)
        self.root.lock_ref = 1  # the root is never evicted
        self.evictable_size = 0
        self.protected_size = 0
        self.version = 0  # bumped on every structural change, so UIs know when to redraw
        self.on_evict = on_evict

    # -- lookup ---------------------------------------------------------------------------------------

    def _walk(self, ids: Sequence[int]) -> Iterator[tuple[TreeNode, int]]:
        """Read-only walk: (node, tokens of its edge that match) along the longest match of ``ids``."""
        node, pos = self.root, 0
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                return
            n = common_prefix_len(ids, pos, child.key)
            yield child, n
            if n < len(child.key):
                return
            pos += n
            node = child

    def prefix_len(self, ids: Sequence[int]) -> int:
        """Length of the longest cached prefix, without touching LRU state or splitting."""
        return sum(n for _, n in self._walk(ids))

    def peek(self, ids: Sequence[int]) -> torch.Tensor:
        """Slots of the longest cached prefix, without touching LRU state or splitting (for checks)."""
        parts = [node.value[:n] for node, n in self._walk(ids)]
        return torch.cat(parts) if parts else _EMPTY

    def shared_prefix_len(self, ids: Sequence[int], other: Sequence[int]) -> int:
        return common_prefix_len(ids, 0, other)

    def path_node_ids(self, ids: Sequence[int]) -> list[int]:
        """Ids of the nodes (root excluded) that the longest match of ``ids`` passes through."""
        return [node.id for node, _ in self._walk(ids)]

    def _descend(self, ids: Sequence[int]) -> tuple[TreeNode, int, int]:
        """Walk the longest match, splitting the last node where the match ends inside it and marking
        every node on the way as just used. Returns (the node the match ends at, its length, the time)."""
        node, pos = self.root, 0
        now = next(self._clock)
        while pos < len(ids):
            child = node.children.get(ids[pos])
            if child is None:
                break
            n = common_prefix_len(ids, pos, child.key)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            pos += n
            node = child
        return node, pos, now

    def match_prefix(self, ids: Sequence[int]) -> MatchResult:
        node, _, _ = self._descend(ids)
        parts: list[torch.Tensor] = []
        walk = node
        while walk is not self.root:
            parts.append(walk.value)
            walk = walk.parent  # type: ignore[assignment]
        slots = torch.cat(parts[::-1]) if parts else _EMPTY
        return MatchResult(slots, node)

    # -- mutation -------------------------------------------------------------------------------------

    def insert(self, ids: Sequence[int], slots: torch.Tensor) -> InsertResult:
        if len(ids) != slots.numel():
            raise ValueError(f"insert: {len(ids)} ids but {slots.numel()} slots")
        node, prefix_len, now = self._descend(ids)
        if prefix_len < len(ids):
            leaf = TreeNode(next(self._ids), list(ids[prefix_len:]), slots[prefix_len:].clone(), node)
            leaf.last_access = now
            node.children[leaf.key[0]] = leaf
            self.evictable_size += len(leaf)
            self.version += 1
            node = leaf
        return InsertResult(prefix_len, node)

    # -- requests -------------------------------------------------------------------------------------

    def cache_unfinished_req(self, req: Request, table: ReqToTokenTable) -> None:
        ids = req.all_ids[: req.kv_len]
        slots = table.read(req.row, 0, req.kv_len)
        res = self.insert(ids, slots)
        if res.prefix_len > req.cache_len:
            self.pool.free(slots[req.cache_len : res.prefix_len])
        match = self.match_prefix(ids)
        assert match.length == req.kv_len
        table.write(req.row, 0, match.slots)
        self.lock(match.node)
        if req.last_node is not None:
            self.unlock(req.last_node)
        req.last_node = match.node
        req.cache_len = req.kv_len

    def cache_finished_req(self, req: Request, table: ReqToTokenTable) -> None:
        slots = table.read(req.row, 0, req.kv_len)
        res = self.insert(req.all_ids[: req.kv_len], slots)
        dup_end = max(res.prefix_len, req.cache_len)
        self.pool.free(slots[req.cache_len : dup_end])

    def _split(self, node: TreeNode, at: int) -> TreeNode:
        """Cut ``node``'s edge after ``at`` tokens; return the new upper half (the new parent)."""
        assert 0 < at < len(node.key)
        parent = node.parent
        assert parent is not None
        upper = TreeNode(next(self._ids), node.key[:at], node.value[:at], parent)
        upper.lock_ref = node.lock_ref
        upper.last_access = node.last_access
        upper.from_disk = node.from_disk
        upper.children = {node.key[at]: node}
        parent.children[upper.key[0]] = upper
        node.key = node.key[at:]
        node.value = node.value[at:]
        node.parent = upper
        self.version += 1
        return upper

    def lock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node)
                self.protected_size += len(node)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unlock of unlocked node {node.id}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_size -= len(node)
                self.evictable_size += len(node)
            node = node.parent  # type: ignore[assignment]

    def evict(self, n: int) -> int:
        """Free at least ``n`` tokens from unlocked leaves, least recently used first. Returns freed."""
        if n <= 0:
            return 0
        heap = [(leaf.last_access, leaf.id, leaf) for leaf in self._unlocked_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < n and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            if self.on_evict is not None:
                self.on_evict(leaf)
            self.pool.free(leaf.value)
            freed += len(leaf)
            self.evictable_size -= len(leaf)
            del parent.children[leaf.key[0]]
            leaf.parent = None
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        if freed:
            self.version += 1
        return freed

    def _unlocked_leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if not node.children and node.lock_ref == 0 and node is not self.root:
                out.append(node)
            stack.extend(node.children.values())
        return out

    def reset(self) -> None:
        """Drop every node (all must be unlocked) and free their slots."""
        if self.protected_size:
            raise RuntimeError("reset while requests hold locked prefixes")
        self.evict(self.evictable_size)

    # -- introspection --------------------------------------------------------------------------------

    def nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def snapshot(self, max_nodes: int = 5000, head: int = 16) -> list[NodeInfo]:
        """Breadth-first list of nodes (parents before children), capped at ``max_nodes``."""
        out: list[NodeInfo] = []
        frontier = sorted(self.root.children.values(), key=lambda c: c.id)
        while frontier and len(out) < max_nodes:
            nxt: list[TreeNode] = []
            for node in frontier:
                if len(out) >= max_nodes:
                    break
                parent_id = node.parent.id if node.parent is not self.root else None  # type: ignore[union-attr]
                out.append(
                    NodeInfo(
                        node.id,
                        parent_id,
                        len(node),
                        tuple(node.key[:head]),
                        node.lock_ref > 0,
                        node.last_access,
                        node.from_disk,
                    )
                )
                nxt.extend(sorted(node.children.values(), key=lambda c: c.id))
            frontier = nxt
        return out

    def owned_slots(self) -> list[int]:
        return [s for node in self.nodes() for s in node.value.tolist()]

    def check_integrity(self) -> None:
        """Recount everything and compare with the incremental counters. Raises AssertionError."""
        evictable = protected = 0
        for node in self.nodes():
            assert node.parent is not None and node.parent.children.get(node.key[0]) is node, node
            assert len(node.key) == node.value.numel() > 0, node
            assert node.lock_ref >= 0, node
            for child in node.children.values():
                assert child.lock_ref <= node.lock_ref, f"child {child} locked more than parent {node}"
            if node.lock_ref:
                protected += len(node)
            else:
                evictable += len(node)
        assert (evictable, protected) == (self.evictable_size, self.protected_size), (
            f"counters {(self.evictable_size, self.protected_size)} != recount {(evictable, protected)}"
        )
