"""What this machine is, and what was measured on it before: torch-free, so ``--help`` can say it cheaply.

The engine measures the weights formats once per machine (``radixchat.engine.weights``) and caches the timings
in ``<cache_dir>/weights-probe.json`` under a key naming the CPU model, its vector extensions, the torch version and
the native kernels' sources (a faster kernel is measured again, not judged by its old timings).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PROBE_FILE = "weights-probe.json"
PROBE_VERSION = 3


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


VECTOR_FLAGS = (
    "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve",
)  # fmt: skip


def cpu_isa() -> str:
    """The vector extensions compiled code and kernels depend on ("avx2 fma ..."): CPU model names do not
    tell them apart in every VM (one "AMD EPYC" has AVX-512, another does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return " ".join(f for f in VECTOR_FLAGS if f in have) or "none"
    except OSError:
        pass
    return platform.machine() or "unknown"


def torch_version() -> str:
    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


#: 1-minute load average per CPU at or above which a measurement of this machine is not trusted for good.
BUSY_LOAD = 0.75


def cpu_load() -> float:
    """The 1-minute load average per CPU (0.0 where the OS does not tell)."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return 0.0


@functools.cache
def kernels_version() -> str:
    """A hash of the native kernels' sources (``engine/kernels/*.cpp``, read as files): their speed is part of
    what a probe measured."""
    h = hashlib.sha256()
    for src in sorted((Path(__file__).parent / "engine" / "kernels").glob("*.cpp")):
        h.update(src.read_bytes())
    return h.hexdigest()[:12]


def probe_key() -> str:
    return f"{cpu_name()} [{cpu_isa()}] | torch {torch_version()} | v{PROBE_VERSION} | kernels {kernels_version()}"


def read_probes(cache_dir: Path) -> dict[str, Any]:
    """This machine's cached probe results, by model-shape signature ({} if none or unreadable)."""
    try:
        data = json.loads((cache_dir / PROBE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    entry = data.get(probe_key()) if isinstance(data, dict) else None
    return entry if isinstance(entry, dict) else {}


def trusted_timings(cache_dir: Path | None, signature: str, load: float, hold: bool = False) -> Any:
    """The timings cached under ``signature``, or None where there are none, or where they were measured on a busy
    machine and this one is quiet now (``load``: its load per CPU): such a probe is used only until a start finds
    the machine quiet, which measures again. ``hold``: any cached probe is used (a deterministic start: its reply
    may not depend on whether a probe was taken again since the last one)."""
    cached = cached_probe(cache_dir, signature)
    if cached is None or not isinstance(cached.get("timings"), dict):
        return None
    if not hold and cached.get("load", 0.0) >= BUSY_LOAD > load:
        log.info(
            "the %s probe was measured on a busy machine (load %.2f per CPU); measuring again",
            signature.split(" ")[0],
            cached["load"],
        )
        return None
    return cached["timings"]


def cached_probe(cache_dir: Path | None, signature: str) -> dict[str, Any] | None:
    """The result cached under ``signature`` on this machine (its timings, what ``auto`` took, the load), or None."""
    cached = read_probes(cache_dir).get(signature) if cache_dir is not None else None
    return cached if isinstance(cached, dict) else None


def write_probe(cache_dir: Path, signature: str, result: dict[str, Any]) -> None:
    """Add one result under this machine's key (atomically; other machines' entries are kept)."""
    path = Path(os.path.realpath(cache_dir / PROBE_FILE))  # through a link: the file it names is updated
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    entry = data.get(probe_key())
    if not isinstance(entry, dict):
        entry = data[probe_key()] = {}
    entry[signature] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def probed_auto_choice(cache_dir: Path) -> str | None:
    """The weights format ``auto`` picked on this machine (for the first model probed), or None."""
    for result in read_probes(cache_dir).values():
        if isinstance(result, dict) and isinstance(result.get("auto"), str):
            return result["auto"]
    return None
