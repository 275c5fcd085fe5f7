"""The KV store on disk: owners, sharing, the budget, atomic saves, and damaged or foreign files."""

from __future__ import annotations

import errno
import os
import time

import pytest
import torch
from safetensors.torch import load_file

import radixchat.engine.kvstore.files as files_module
from radixchat.engine import EngineConfig, SamplingParams
from radixchat.engine.core import EngineCore
from radixchat.engine.kvstore.blocks import BLOCK_TOKENS, encode, read_header
from radixchat.engine.kvstore.files import owner_file
from tests.conftest import hf_greedy

TOKEN_BYTES = 512  # tiny llama: 2 layers x (K, V) x 2 heads x 16 dims x 4 bytes


def rand_ids(seed: int, n: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def core_for(loaded, tmp_path, **kw) -> EngineCore:
    return EngineCore(loaded, EngineConfig(**{"kv_pool_tokens": 2048, "kv_store_dir": tmp_path, **kw}))


def prefill(core: EngineCore, ids: list[int]) -> None:
    core.run_until_done([core.make_request(ids + [0], SamplingParams(max_tokens=1))])


def block_paths(core: EngineCore, owner: str):
    store = core.kv_tier.store
    return [store.blocks_dir / f"{key}.safetensors" for key in store.owner_keys(owner)]


def all_blocks(core: EngineCore) -> set[str]:
    return {p.name for p in core.kv_tier.store.blocks_dir.iterdir()}


def continue_exactly(core: EngineCore, ref, path: list[int], seed: int):
    """Continue ``path`` by a few new tokens; the reply must be what generate() says. Returns the request."""
    turn = path + rand_ids(seed, 5)
    req = core.make_request(turn, SamplingParams(max_tokens=8, ignore_eos=True))
    core.run_until_done([req])
    core.check_integrity()
    assert req.output_ids == hf_greedy(ref, turn, 8)
    return req


@pytest.fixture
def llama(tiny_models):
    return tiny_models["llama"]


# -- owners and sharing -------------------------------------------------------------------------------


def test_a_later_save_writes_only_new_blocks_and_drops_the_superseded_tail(llama, tmp_path):
    loaded, _ = llama
    core = core_for(loaded, tmp_path)
    path = rand_ids(1, 340)
    prefill(core, path)
    first = core.kv_tier.save(path[:300], "s")  # 4 full blocks + 44 tokens
    assert first.tokens == 300 and len(all_blocks(core)) == 5
    again = core.kv_tier.save(path[:300], "s")
    assert again.tokens == 300 and again.written_bytes == 0
    longer = core.kv_tier.save(path, "s")  # 5 full blocks + 20: the 44-token tail is superseded
    assert longer.tokens == 340
    assert longer.written_bytes < (BLOCK_TOKENS + 20) * TOKEN_BYTES + 2 * 4096
    assert len(all_blocks(core)) == 6 and set(p.name for p in block_paths(core, "s")) == all_blocks(core)


def test_owners_share_their_common_blocks_and_deleting_one_keeps_the_other(llama, tmp_path):
    loaded, ref = llama
    core = core_for(loaded, tmp_path)
    a = rand_ids(2, 300)
    b = a[:200] + rand_ids(3, 100)
    prefill(core, a)
    prefill(core, b)
    sa = core.kv_tier.save(a, "a")
    sb = core.kv_tier.save(b, "b")
    assert sb.written_bytes < sa.written_bytes / 2  # blocks 0-2 (192 tokens) are shared
    usage = core.kv_tier.store.usage()
    assert usage.owners["a"].tokens == usage.owners["b"].tokens == 300
    assert usage.total_bytes < usage.owners["a"].bytes + usage.owners["b"].bytes
    assert core.kv_tier.store.delete_owner("a") > 0
    fresh = core_for(loaded, tmp_path)
    assert fresh.kv_tier.load(b).loaded_tokens == 300
    continue_exactly(fresh, ref, b, 4)
    core.kv_tier.store.delete_owner("b")
    assert all_blocks(core) == set() and core.kv_tier.store.usage().total_bytes == 0


def test_saving_covers_what_was_spilled_after_the_tree_evicted_it(llama, tmp_path):
    loaded, _ = llama
    core = core_for(loaded, tmp_path, kv_spill=True)
    path = rand_ids(5, 200)
    prefill(core, path)
    core.cache.evict(core.cache.evictable_size)
    assert core.cache.total_size == 0 and core.scheduler.counters.spilled_tokens >= 200
    assert core.kv_tier.save(path, "s").tokens == 200  # nothing in the pool, all of it on disk
    assert core.kv_tier.store.usage().unowned_bytes < 2 * BLOCK_TOKENS * TOKEN_BYTES


def test_rename_moves_the_kv_and_replaces_the_target(llama, tmp_path):
    loaded, _ = llama
    core = core_for(loaded, tmp_path)
    a, b = rand_ids(6, 100), rand_ids(7, 100)
    prefill(core, a)
    prefill(core, b)
    core.kv_tier.save(a, "old")
    core.kv_tier.save(b, "new")
    assert core.kv_tier.store.rename_owner("old", "new")
    usage = core.kv_tier.store.usage()
    assert set(usage.owners) == {"new"} and usage.total_bytes == usage.owners["new"].bytes
    assert not core.kv_tier.store.rename_owner("missing", "x")


# -- the budget ---------------------------------------------------------------------------------------


def _age(paths, seconds: float) -> None:
    t = time.time() - seconds
    for p in paths:
        os.utime(p, (t, t))


def test_the_budget_evicts_the_least_recently_used_path(llama, tmp_path):
    loaded, _ = llama
    budget = 2 * 300 * TOKEN_BYTES + 40_000  # two 300-token paths fit, three do not
    core = core_for(loaded, tmp_path, kv_store_bytes=budget)
    paths = [rand_ids(10 + i, 300) for i in range(3)]
    for p in paths:
        prefill(core, p)
    core.kv_tier.save(paths[0], "s0")
    core.kv_tier.save(paths[1], "s1")
    _age(block_paths(core, "s1") + [*core.kv_tier.store.owners_dir.iterdir()], 200)
    _age(block_paths(core, "s0"), 100)  # s0 was used (loaded) more recently than s1
    core.kv_tier.save(paths[2], "s2")
    usage = core.kv_tier.store.usage()
    assert set(usage.owners) == {"s0", "s2"} and usage.total_bytes <= budget


def test_the_budget_evicts_paths_sharing_a_prefix_with_the_saved_one(llama, tmp_path):
    """Sessions with one system prompt share its blocks; evicting one must keep the shared blocks."""
    loaded, ref = llama
    budget = (128 + 2 * 172) * TOKEN_BYTES + 40_000  # the shared 128 tokens and two own 172-token tails
    core = core_for(loaded, tmp_path, kv_store_bytes=budget)
    system = rand_ids(15, 128)
    paths = [system + rand_ids(16 + i, 172) for i in range(4)]
    for i, p in enumerate(paths):
        prefill(core, p)
        core.kv_tier.save(p, f"s{i}")
        record = core.kv_tier.store.owners_dir / owner_file(f"s{i}")
        _age([*block_paths(core, f"s{i}"), record], 100 - i)  # later saves are more recent
    usage = core.kv_tier.store.usage()
    assert set(usage.owners) == {"s2", "s3"} and usage.owners["s3"].tokens == 300
    assert usage.total_bytes <= budget
    fresh = core_for(loaded, tmp_path)
    assert fresh.kv_tier.load(paths[3]).loaded_tokens == 300  # the shared blocks survived
    continue_exactly(fresh, ref, paths[3], 17)


def test_unowned_spilled_blocks_go_before_saved_sessions(llama, tmp_path):
    loaded, _ = llama
    budget = 2 * 300 * TOKEN_BYTES + 40_000
    core = core_for(loaded, tmp_path, kv_store_bytes=budget, kv_spill=True)
    saved, spilled, second = rand_ids(20, 300), rand_ids(21, 300), rand_ids(22, 300)
    prefill(core, saved)
    core.kv_tier.save(saved, "s")
    prefill(core, spilled)
    core.cache.evict(core.cache.evictable_size)  # spills: the store holds s and 300 unowned tokens
    prefill(core, second)
    core.kv_tier.save(second, "t")
    usage = core.kv_tier.store.usage()
    assert set(usage.owners) == {"s", "t"} and usage.unowned_bytes == 0


def test_a_path_larger_than_the_budget_keeps_its_beginning(llama, tmp_path):
    loaded, _ = llama
    core = core_for(loaded, tmp_path, kv_store_bytes=100_000)
    path = rand_ids(30, 300)
    prefill(core, path)
    res = core.kv_tier.save(path, "big")
    assert res.tokens == 2 * BLOCK_TOKENS and "budget" in res.notice
    assert core.kv_tier.store.usage().total_bytes <= 100_000


# -- faults -------------------------------------------------------------------------------------------


def _rewrite(path, **changes) -> None:
    meta, _ = read_header(path)
    kv = changes.pop("kv", load_file(path)["kv"])
    fields = dict(fingerprint=meta["fingerprint"], key=meta["key"], parent=meta["parent"])
    fields.update(changes)
    ids = [int(t) for t in meta["ids"].split(",")]
    path.write_bytes(encode(kv.contiguous(), start=int(meta["start"]), ids=ids, **fields))


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "corrupted": lambda p: p.write_bytes(p.read_bytes()[:-1] + b"\x7f"),
    "other model": lambda p: _rewrite(p, fingerprint="0" * 32),
    "other dtype": lambda p: _rewrite(p, kv=load_file(p)["kv"].to(torch.bfloat16)),
    "other shape": lambda p: _rewrite(p, kv=load_file(p)["kv"][:, :, :, :1]),
    "not safetensors": lambda p: p.write_bytes(os.urandom(5000)),
}
REASONS = {
    "truncated": "truncated",
    "corrupted": "checksum",
    "other model": "another model",
    "other dtype": "dtype",
    "other shape": "shape",
    "not safetensors": "",
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_or_foreign_block_is_ignored_and_recomputed(llama, tmp_path, kind):
    loaded, ref = llama
    core = core_for(loaded, tmp_path)
    path = rand_ids(40, 300)
    prefill(core, path)
    core.kv_tier.save(path, "s")
    fresh = core_for(loaded, tmp_path)  # indexes the intact files
    bad = block_paths(core, "s")[2]
    DAMAGE[kind](bad)
    res = fresh.kv_tier.load(path)
    assert res.loaded_tokens == 2 * BLOCK_TOKENS  # the blocks before the bad one
    assert len(res.notices) == 1 and "\n" not in res.notices[0] and REASONS[kind] in res.notices[0]
    assert "recomputed" in res.notices[0]
    assert not bad.exists()
    fresh.check_integrity()
    assert continue_exactly(fresh, ref, path, 41).cached_tokens == 2 * BLOCK_TOKENS


def test_a_damaged_header_is_dropped_when_the_store_opens(llama, tmp_path):
    loaded, _ = llama
    core = core_for(loaded, tmp_path)
    path = rand_ids(42, 300)
    prefill(core, path)
    core.kv_tier.save(path, "s")
    bad = block_paths(core, "s")[0]
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    fresh = core_for(loaded, tmp_path)
    assert not bad.exists()
    assert fresh.kv_tier.load(path).loaded_tokens == 0
    notices = fresh.kv_tier.store.usage().notices
    assert len(notices) == 1 and "unreadable header" in notices[0]


def test_another_models_store_is_not_used(tiny_models, tmp_path):
    llama, qwen = tiny_models["llama"][0], tiny_models["qwen2"][0]
    path = rand_ids(43, 200)
    a = core_for(llama, tmp_path)
    prefill(a, path)
    a.kv_tier.save(path, "s")
    b = core_for(qwen, tmp_path)
    assert b.kv_tier.store.dir != a.kv_tier.store.dir
    assert b.kv_tier.load(path).loaded_tokens == 0
    assert b.kv_tier.store.usage().owners == {}
    assert b.kv_tier.store.delete_owner("s") > 0  # deleting a session deletes its KV for every model
    assert a.kv_tier.store.usage().owners == {}


class _FullDisk:
    """A file whose writes fail with ENOSPC after ``room`` bytes (the one place a fake is right)."""

    def __init__(self, real, room: int) -> None:
        self.real, self.room = real, room

    def write(self, data) -> int:
        if len(data) > self.room:
            self.real.write(data[: self.room])
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.real.write(data)

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.real.close()


@pytest.mark.parametrize("fails", ["block", "record"])
def test_a_full_disk_loses_nothing_already_saved(llama, tmp_path, monkeypatch, fails):
    loaded, ref = llama
    core = core_for(loaded, tmp_path)
    path = rand_ids(50, 400)
    prefill(core, path)
    assert core.kv_tier.save(path[:200], "s").tokens == 200
    before = all_blocks(core)
    real_open = open

    def full_disk(p, mode):
        target = ".safetensors" if fails == "block" else ".json"
        return _FullDisk(real_open(p, mode), 10 if target in p.name else 1 << 30)

    monkeypatch.setattr(files_module, "open", full_disk, raising=False)
    res = core.kv_tier.save(path, "s")
    assert res.tokens == 0 and "the disk is full" in res.notice and "'s'" in res.notice
    monkeypatch.undo()
    leftovers = [p.name for p in core.kv_tier.store.dir.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []  # no partial file under any name
    if fails == "block":
        assert all_blocks(core) == before
    assert core.kv_tier.store.usage().owners["s"].tokens == 200  # the earlier save is intact
    fresh = core_for(loaded, tmp_path)
    # Blocks written before the record failed are valid, unowned (the budget's first to go) and usable.
    assert fresh.kv_tier.load(path).loaded_tokens == (200 if fails == "block" else 400)
    continue_exactly(fresh, ref, path, 51)


def test_a_full_disk_stops_spilling_and_generation_goes_on(llama, tmp_path, monkeypatch):
    loaded, ref = llama
    core = core_for(loaded, tmp_path, kv_pool_tokens=330, kv_spill=True)
    real_open = open
    monkeypatch.setattr(files_module, "open", lambda p, mode: _FullDisk(real_open(p, mode), 0), raising=False)
    prompts = [rand_ids(60 + i, 140) for i in range(4)]
    reqs = [core.make_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
    for req in reqs:
        core.run_until_done([req])
    core.check_integrity()
    assert core.scheduler.counters.evicted_tokens > 0 and core.scheduler.counters.spilled_tokens == 0
    assert any("spilling to disk stopped" in n for n in core.kv_tier.store.usage().notices)
    for p, req in zip(prompts, reqs):
        assert req.output_ids == hf_greedy(ref, p, 8)


def test_an_unwritable_store_directory_turns_the_store_off(llama, tmp_path):
    loaded, _ = llama
    (tmp_path / "kv").write_text("a file where the directory should be")
    core = core_for(loaded, tmp_path / "kv")
    assert core.kv_tier is None
    prefill(core, rand_ids(70, 50))


def test_a_failing_spill_turns_spilling_off_and_generation_goes_on(llama, tmp_path, monkeypatch):
    loaded, ref = llama
    core = core_for(loaded, tmp_path, kv_pool_tokens=330, kv_spill=True)

    def broken(*args):
        raise RuntimeError("a bug in encoding")

    monkeypatch.setattr(core.kv_tier.spiller, "_encode", broken)
    prompts = [rand_ids(80 + i, 140) for i in range(3)]
    reqs = [core.make_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
    for req in reqs:
        core.run_until_done([req])
    core.check_integrity()
    assert core.scheduler.counters.evicted_tokens > 0 and core.kv_tier.spiller.failed
    assert all(r.finish_reason.value == "length" for r in reqs)
    for p, req in zip(prompts, reqs):
        assert req.output_ids == hf_greedy(ref, p, 8)
