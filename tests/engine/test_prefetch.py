"""The decode products' prefetch distance: a speed setting measured per machine, which never changes a result."""

from __future__ import annotations

import pytest
import torch

from radixchat.engine import prefetch
from radixchat.engine.kernels import load_paged_attention, native_ready


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    load_paged_attention(tmp_path_factory.mktemp("kernels"))
    if not native_ready():
        pytest.skip("no native kernels on this machine")
    yield torch.ops.radixchat
    for name in prefetch.STREAMERS:
        torch.ops.radixchat.set_prefetch(name, 0)


@pytest.mark.parametrize("name", prefetch.STREAMERS)
def test_every_distance_gives_the_same_bits(native, name):
    gen = torch.Generator().manual_seed(3)
    op = getattr(native, name)
    codes, scales = prefetch._operands(name, gen)
    x = torch.randn(3, prefetch._SIDE, generator=gen)
    native.set_prefetch(name, 0)
    want = op(x, codes, scales)
    assert torch.isfinite(want).all()
    for ahead in prefetch.DISTANCES[1:]:
        assert native.set_prefetch(name, ahead) in prefetch.DISTANCES  # returns the previous distance
        assert torch.equal(op(x, codes, scales), want), ahead
        assert torch.equal(op(x[1:2], codes, scales), want[1:2]), ahead
    native.set_prefetch(name, 0)


def test_an_unknown_product_or_distance_is_refused(native):
    with pytest.raises(RuntimeError, match="no decode product"):
        native.set_prefetch("int3_gemv", 0)
    with pytest.raises(RuntimeError, match="0 to 1 MiB"):
        native.set_prefetch("int4_gemv", -1)


def test_a_distance_is_taken_only_when_it_clearly_beats_none():
    assert prefetch.choose({"0": 1.0, "2048": 0.97, "4096": 0.99}) == 0  # within the margin
    assert prefetch.choose({"0": 1.0, "2048": 0.90, "4096": 0.80, "8192": 0.85}) == 4096
    assert prefetch.choose({"0": 0.5, "4096": 0.8}) == 0
    assert prefetch.choose({}) == 0


def test_auto_measures_once_per_machine_and_sets_what_it_chose(native, tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "PROBE_BYTES", 8 << 20)
    monkeypatch.setattr(prefetch, "PROBE_ROUNDS", 1)
    monkeypatch.setattr(prefetch, "cpu_load", lambda: 0.0)
    chosen = prefetch.apply_prefetch("auto", tmp_path)
    assert set(chosen) == set(prefetch.STREAMERS) and set(chosen.values()) <= set(prefetch.DISTANCES)
    for name, ahead in chosen.items():  # set_prefetch hands back what was set
        assert native.set_prefetch(name, ahead) == ahead

    def no_probe():
        raise AssertionError("measured again")

    monkeypatch.setattr(prefetch, "probe", no_probe)
    assert prefetch.apply_prefetch("auto", tmp_path) == chosen  # from the cache
    assert prefetch.apply_prefetch("off", tmp_path) == dict.fromkeys(prefetch.STREAMERS, 0)
    assert all(native.set_prefetch(name, 0) == 0 for name in prefetch.STREAMERS)
    assert prefetch.apply_prefetch(None, tmp_path) == {}


def test_a_probe_taken_on_a_busy_machine_is_measured_again_once_quiet(native, tmp_path, monkeypatch):
    monkeypatch.setattr(prefetch, "PROBE_BYTES", 4 << 20)
    monkeypatch.setattr(prefetch, "PROBE_ROUNDS", 1)
    monkeypatch.setattr(prefetch, "cpu_load", lambda: 2.0)
    prefetch.apply_prefetch("auto", tmp_path)
    calls = []
    real = prefetch.probe
    monkeypatch.setattr(prefetch, "probe", lambda: calls.append(1) or real())
    monkeypatch.setattr(prefetch, "cpu_load", lambda: 0.0)
    prefetch.apply_prefetch("auto", tmp_path)
    prefetch.apply_prefetch("auto", tmp_path)
    assert calls == [1]
