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


def test_a_busy_probe_is_measured_again_once_quiet_unless_the_start_holds_it(tmp_path):
    machine.write_probe(tmp_path, "sig", {"timings": {"a": 1.0}, "auto": "a", "load": 2.0})
    assert machine.trusted_timings(tmp_path, "sig", 1.5) == {"a": 1.0}  # still busy: used
    assert machine.trusted_timings(tmp_path, "sig", 0.1) is None  # quiet now: measure again
    assert machine.trusted_timings(tmp_path, "sig", 0.1, hold=True) == {"a": 1.0}  # deterministic: kept
    assert (
        machine.cached_probe(tmp_path, "sig")["auto"] == "a"
        and machine.cached_probe(tmp_path, "other") is None
    )


def test_a_probe_file_reached_through_a_link_is_updated_where_it_lies(tmp_path):
    """A cache that links another's probe file (as a borrowed cache does) updates that file, not the link."""
    own, borrowed = tmp_path / "own", tmp_path / "borrowed"
    own.mkdir()
    borrowed.mkdir()
    machine.write_probe(own, "first", {"timings": {}, "load": 0.0})
    (borrowed / machine.PROBE_FILE).symlink_to(own / machine.PROBE_FILE)
    machine.write_probe(borrowed, "second", {"timings": {}, "load": 0.0})
    assert (borrowed / machine.PROBE_FILE).is_symlink()
    assert set(machine.read_probes(own)) == {"first", "second"}
