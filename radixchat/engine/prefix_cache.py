"""The prefix cache interface, which the scheduler and the core program against, and the no-reuse cache.

``PrefixCache``'s docstrings are the contract. Two caches stand behind it: ``RadixCache``
(``radix_cache.py``), which shares the KV of common prefixes between requests, and ``NoReuseCache``
below, the ablation (``radix_cache = off``): every request computes its whole prompt, and its slots are
freed when it ends. The baseline is a class, not a flag the scheduler tests.

Slots a request holds fall into regions (see ``request.py``): ``[0, cache_len)`` is the cache's (pinned
by locking ``req.last_node``), ``[cache_len, kv_len)`` is private to the request.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from radixchat.engine.kv_pool import KVPool, ReqToTokenTable
from radixchat.engine.tree_node import TreeNode

if TYPE_CHECKING:
    from radixchat.engine.request import Request

EMPTY_SLOTS = torch.empty(0, dtype=torch.int64)


class MatchResult(NamedTuple):
    slots: torch.Tensor  # int64 CPU, one slot per matched token
    node: TreeNode  # the node whose root path is exactly the match

    @property
    def length(self) -> int:
        return int(self.slots.numel())


class InsertResult(NamedTuple):
    prefix_len: int  # tokens of ``ids`` that were cached before this insert
    node: TreeNode  # the node where ``ids`` ends


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One node of a tree snapshot, for drawing (no tensors, safe to hand to another thread)."""

    id: int
    parent_id: int | None
    num_tokens: int
    head_ids: tuple[int, ...]  # the first tokens of the edge, for a snippet
    locked: bool
    last_access: int
    from_disk: bool = False


class PrefixCache(ABC):
    """Cached prefixes whose KV slots requests share. Counters, kept up to date by every operation:
    ``evictable_size`` (tokens in unlocked nodes), ``protected_size`` (tokens in locked nodes), and
    ``version``, bumped on every structural change so UIs know when to redraw."""

    pool: KVPool
    root: TreeNode
    evictable_size: int
    protected_size: int
    version: int

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    # -- lookup ---------------------------------------------------------------------------------------

    @abstractmethod
    def match_prefix(self, ids: Sequence[int]) -> MatchResult:
        """The slots of the longest cached prefix of ``ids`` and the node where it ends (the root for no
        match). The slots are safe to use only while that node is locked. Marks the path as just used."""

    @abstractmethod
    def prefix_len(self, ids: Sequence[int]) -> int:
        """Length of the longest cached prefix, without touching LRU state (for admission order)."""

    @abstractmethod
    def shared_prefix_len(self, ids: Sequence[int], other: Sequence[int]) -> int:
        """How many leading tokens of ``ids`` a request would find cached once a request over ``other``
        has published its KV (so whether waiting a step for it saves computing them twice)."""

    @abstractmethod
    def peek(self, ids: Sequence[int]) -> torch.Tensor:
        """Slots of the longest cached prefix, without touching LRU state or splitting (for checks)."""

    @abstractmethod
    def path_node_ids(self, ids: Sequence[int]) -> list[int]:
        """Ids of the nodes (root excluded) that the longest match of ``ids`` passes through."""

    # -- locks and eviction ---------------------------------------------------------------------------

    @abstractmethod
    def lock(self, node: TreeNode) -> None:
        """Pin ``node``'s path to the root: its tokens move from evictable to protected."""

    @abstractmethod
    def unlock(self, node: TreeNode) -> None:
        """Undo one ``lock(node)``."""

    @abstractmethod
    def evict(self, n: int) -> int:
        """Free at least ``n`` tokens of unlocked nodes, least recently used first, or all there are.
        Returns how many were freed (it may be more than asked)."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every node (all must be unlocked) and free their slots."""

    # -- requests -------------------------------------------------------------------------------------

    @abstractmethod
    def cache_unfinished_req(self, req: Request, table: ReqToTokenTable) -> None:
        """Publish a running request's computed KV (``[0, kv_len)``) so that others can share it now. A
        cache that shares adopts the request's private slots, frees its duplicates, points its table row at
        the cache's slots and moves its lock to the new node (``cache_len`` becomes ``kv_len``)."""

    @abstractmethod
    def cache_finished_req(self, req: Request, table: ReqToTokenTable) -> None:
        """Take a released request's KV: the cache adopts what it keeps and frees the rest of the private
        region ``[cache_len, kv_len)``. The caller then unlocks ``req.last_node`` and frees the row."""

    # -- introspection --------------------------------------------------------------------------------

    @abstractmethod
    def snapshot(self, max_nodes: int = 5000, head: int = 16) -> list[NodeInfo]:
        """Breadth-first list of nodes (parents before children), capped at ``max_nodes``."""

    @abstractmethod
    def owned_slots(self) -> list[int]:
        """Every slot the cache owns (for the integrity check)."""

    @abstractmethod
    def check_integrity(self) -> None:
        """Recount everything and compare with the incremental counters. Raises AssertionError."""


class NoReuseCache(PrefixCache):
    """The ablation: nothing is ever cached, so every match is empty and a request's KV is freed when it
    ends. Everything a request computes stays private to it."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.root = TreeNode(0, [], EMPTY_SLOTS, None)
        self.evictable_size = 0
        self.protected_size = 0
        self.version = 0

    def match_prefix(self, ids: Sequence[int]) -> MatchResult:
        return MatchResult(EMPTY_SLOTS, self.root)

    def prefix_len(self, ids: Sequence[int]) -> int:
        return 0

    def shared_prefix_len(self, ids: Sequence[int], other: Sequence[int]) -> int:
        return 0

    def peek(self, ids: Sequence[int]) -> torch.Tensor:
        return EMPTY_SLOTS

    def path_node_ids(self, ids: Sequence[int]) -> list[int]:
        return []

    def lock(self, node: TreeNode) -> None:
        pass

    def unlock(self, node: TreeNode) -> None:
        pass

    def evict(self, n: int) -> int:
        return 0

    def reset(self) -> None:
        pass

    def cache_unfinished_req(self, req: Request, table: ReqToTokenTable) -> None:
        pass

    def cache_finished_req(self, req: Request, table: ReqToTokenTable) -> None:
        self.pool.free(table.read(req.row, req.cache_len, req.kv_len))

    def snapshot(self, max_nodes: int = 5000, head: int = 16) -> list[NodeInfo]:
        return []

    def owned_slots(self) -> list[int]:
        return []

    def check_integrity(self) -> None:
        pass
