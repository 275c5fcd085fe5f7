"""What a probe's cache is keyed by: a result measured with other native kernels is not this machine's result."""

from __future__ import annotations

import hashlib
from pathlib import Path

from radixchat import machine


def test_the_kernels_version_is_a_hash_of_the_native_kernels_sources():
    sources = sorted((Path(machine.__file__).parent / "engine" / "kernels").glob("*.cpp"))
    assert {p.name for p in sources} >= {"int4.cpp", "paged_attention.cpp"}
    h = hashlib.sha256()
    for src in sources:
        h.update(src.read_bytes())
    assert machine.kernels_version() == h.hexdigest()[:12]
    assert machine.kernels_version() in machine.probe_key()


def test_a_probe_cached_with_other_kernels_is_measured_again(tmp_path, monkeypatch):
    machine.write_probe(tmp_path, "layers:64x64", {"timings": {"layers": {}}, "load": 0.0})
    assert machine.read_probes(tmp_path) == {"layers:64x64": {"timings": {"layers": {}}, "load": 0.0}}
    monkeypatch.setattr(machine, "kernels_version", lambda: "another-build")
    assert machine.read_probes(tmp_path) == {}
    machine.write_probe(tmp_path, "layers:64x64", {"timings": {}, "load": 0.0})
    assert machine.read_probes(tmp_path) == {"layers:64x64": {"timings": {}, "load": 0.0}}
