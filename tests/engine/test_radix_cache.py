"""The radix tree: structure, lock accounting, LRU eviction, and a property test of slot ownership."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixchat.engine.kv_pool import KVPool, KVShape
from radixchat.engine.radix_cache import RadixCache


def make_cache(capacity: int = 64) -> tuple[KVPool, RadixCache]:
    pool = KVPool(KVShape(1, 1, 2, torch.float32), capacity, torch.device("cpu"))
    return pool, RadixCache(pool)


def put(pool: KVPool, cache: RadixCache, ids: list[int]) -> tuple[int, torch.Tensor]:
    """Insert ``ids`` the way the scheduler does: allocate, insert, free duplicates."""
    slots = torch.tensor(pool.alloc(len(ids)), dtype=torch.int64)
    res = cache.insert(ids, slots)
    pool.free(slots[: res.prefix_len])
    return res.prefix_len, slots


def test_insert_returns_already_cached_length():
    pool, cache = make_cache()
    assert put(pool, cache, [1, 2, 3, 4])[0] == 0
    assert put(pool, cache, [1, 2, 3, 4, 5])[0] == 4
    assert put(pool, cache, [1, 2, 9])[0] == 2
    assert cache.total_size == 6
    cache.check_integrity()


def test_match_splits_node_and_returns_tree_slots():
    pool, cache = make_cache()
    _, slots = put(pool, cache, [1, 2, 3, 4])
    match = cache.match_prefix([1, 2, 7])
    assert match.length == 2
    assert match.slots.tolist() == slots[:2].tolist()
    assert match.node.key == [1, 2] and len(cache.nodes()) == 2  # split into [1,2] -> [3,4]
    cache.check_integrity()


def test_match_of_unknown_prefix_is_empty():
    _, cache = make_cache()
    match = cache.match_prefix([5, 6])
    assert match.length == 0 and match.node is cache.root


def test_lock_moves_tokens_between_evictable_and_protected():
    pool, cache = make_cache()
    put(pool, cache, [1, 2, 3, 4])
    put(pool, cache, [1, 2, 5])
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    assert (cache.protected_size, cache.evictable_size) == (4, 1)
    cache.lock(node)
    assert cache.protected_size == 4
    cache.unlock(node)
    assert cache.protected_size == 4
    cache.unlock(node)
    assert (cache.protected_size, cache.evictable_size) == (0, 5)
    cache.check_integrity()


def test_split_copies_lock_ref_to_new_parent():
    pool, cache = make_cache()
    put(pool, cache, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(node)
    upper = cache.match_prefix([1, 2]).node
    assert upper.lock_ref == 1 and node.lock_ref == 1
    cache.unlock(node)
    assert cache.protected_size == 0
    cache.check_integrity()


def test_evict_frees_least_recently_used_leaves_first():
    pool, cache = make_cache()
    put(pool, cache, [1, 1])
    put(pool, cache, [2, 2])
    put(pool, cache, [3, 3])
    cache.match_prefix([1, 1])  # touch: now [2,2] is the oldest
    free_before = pool.num_free
    assert cache.evict(1) == 2
    assert pool.num_free == free_before + 2
    assert cache.prefix_len([2, 2]) == 0
    assert cache.prefix_len([1, 1]) == 2 and cache.prefix_len([3, 3]) == 2
    cache.check_integrity()


def test_new_leaves_count_as_just_used():
    pool, cache = make_cache()
    put(pool, cache, [5, 5])
    put(pool, cache, [1, 1])
    cache.match_prefix([5, 5])  # now [1,1] is the oldest...
    put(pool, cache, [9, 9])  # ...and a new leaf is the newest, whatever its id
    assert cache.evict(1) == 2 and cache.prefix_len([1, 1]) == 0
    assert cache.evict(1) == 2 and cache.prefix_len([5, 5]) == 0
    assert cache.prefix_len([9, 9]) == 2


def test_evict_cascades_to_parent_and_skips_locked():
    pool, cache = make_cache()
    put(pool, cache, [1, 2, 3])
    put(pool, cache, [1, 2, 4])
    put(pool, cache, [9])
    locked = cache.match_prefix([9]).node
    cache.lock(locked)
    assert cache.evict(100) == 4  # [3], [4], then their parent [1,2]; [9] is locked
    assert cache.total_size == 1
    cache.unlock(locked)
    cache.check_integrity()


def test_evict_never_frees_a_locked_prefix():
    pool, cache = make_cache()
    put(pool, cache, [1, 2, 3, 4])
    node = cache.match_prefix([1, 2]).node
    cache.lock(node)
    cache.evict(100)
    assert cache.prefix_len([1, 2, 3, 4]) == 2
    cache.unlock(node)
    cache.check_integrity()


def test_unlock_of_unlocked_node_raises():
    pool, cache = make_cache()
    put(pool, cache, [1])
    node = cache.match_prefix([1]).node
    try:
        cache.unlock(node)
    except RuntimeError:
        return
    raise AssertionError("unlock below zero must raise")


def test_pool_refuses_double_free():
    pool, _ = make_cache(4)
    slots = pool.alloc(2)
    pool.free(slots)
    try:
        pool.free(slots)
    except RuntimeError:
        return
    raise AssertionError("double free must raise")


def test_snapshot_lists_parents_before_children():
    pool, cache = make_cache()
    put(pool, cache, [1, 2, 3])
    put(pool, cache, [1, 2, 4])
    snap = cache.snapshot()
    seen: set[int] = set()
    for node in snap:
        assert node.parent_id is None or node.parent_id in seen
        seen.add(node.id)
    assert sorted(n.num_tokens for n in snap) == [1, 1, 2]


class CacheMachine(RuleBasedStateMachine):
    """Random insert / match+lock / unlock / evict sequences over a small alphabet.

    Every step: free + tree-owned == capacity, no slot is owned twice, counters match a recount, and
    every held match still reads the slots it was given (no use after free)."""

    @initialize()
    def setup(self):
        self.pool, self.cache = make_cache(48)
        self.held: list[tuple[list[int], list[int], object]] = []  # (ids, slots, node)

    @rule(ids=st.lists(st.integers(0, 3), min_size=1, max_size=10))
    def insert(self, ids):
        match = self.cache.match_prefix(ids)
        self.cache.lock(match.node)  # as the scheduler does: pin the prefix before evicting
        need = len(ids) - match.length
        if need > self.pool.num_free:
            self.cache.evict(need - self.pool.num_free)
        new = self.pool.alloc(need)
        self.cache.unlock(match.node)
        if new is None:
            return
        slots = torch.cat([match.slots, torch.tensor(new, dtype=torch.int64)])
        res = self.cache.insert(ids, slots)
        assert res.prefix_len == match.length
        self.pool.free(slots[match.length : res.prefix_len])

    @rule(ids=st.lists(st.integers(0, 3), min_size=1, max_size=10))
    def match_and_lock(self, ids):
        match = self.cache.match_prefix(ids)
        if match.length:
            self.cache.lock(match.node)
            self.held.append((ids[: match.length], match.slots.tolist(), match.node))

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 100))
    def unlock(self, i):
        _, _, node = self.held.pop(i % len(self.held))
        self.cache.unlock(node)

    @rule(n=st.integers(1, 30))
    def evict(self, n):
        self.cache.evict(n)

    @invariant()
    def integrity(self):
        if not hasattr(self, "cache"):
            return
        self.cache.check_integrity()
        tree = self.cache.owned_slots()
        free = self.pool.free_set()
        assert len(tree) == len(set(tree)), "a slot is owned by two nodes"
        assert not (set(tree) & free), "a slot is both free and in the tree"
        assert len(tree) + len(free) == self.pool.capacity
        for ids, slots, _ in self.held:
            assert self.cache.peek(ids).tolist() == slots, "a locked prefix changed or was freed"


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
