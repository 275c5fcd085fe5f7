"""File operations of the KV store that need no index: atomic writes, owner records, directory scans.

Owner records are ``<fingerprint>/owners/<hash>.json``: ``{"owner": name, "keys": [...], "tokens": n}``.
A file's mtime is its last use (the budget's LRU order).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from radixchat.engine.kvstore.blocks import SUFFIX

STALE_TEMP_S = 3600.0  # temp files older than this were left by a crash


def owner_file(owner: str) -> str:
    return hashlib.blake2b(owner.encode(), digest_size=12).hexdigest() + ".json"


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    Raises OSError (the temp file is removed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform or file system can sync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def describe_os_error(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the disk is full"
    return exc.strerror or type(exc).__name__


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def fingerprint_dirs(root: Path) -> list[Path]:
    try:
        return [p for p in root.iterdir() if p.is_dir() and (p / "blocks").is_dir()]
    except OSError:
        return []


def read_record(path: Path) -> dict | None:
    """An owner record, or None if it is missing or unreadable (a damaged record is not trusted)."""
    try:
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and isinstance(record.get("owner"), str)
    return record if ok and isinstance(record.get("keys"), list) else None


def records(d: Path) -> dict[str, tuple[float, list[str]]]:
    """owner -> (record mtime, block keys) for one fingerprint directory."""
    out = {}
    for path in (d / "owners").glob("*.json"):
        record = read_record(path)
        if record is not None:
            out[record["owner"]] = (mtime(path), record["keys"])
    return out


@dataclass(slots=True)
class DirScan:
    path: Path
    blocks: dict[str, tuple[float, int]]  # key -> (mtime, size)
    owners: dict[str, tuple[float, list[str]]]  # owner -> (record mtime, keys)
    refs: set[str]  # keys some owner uses


def scan_root(root: Path) -> list[DirScan]:
    out = []
    for d in fingerprint_dirs(root):
        blocks: dict[str, tuple[float, int]] = {}
        with contextlib.suppress(OSError):
            for e in os.scandir(d / "blocks"):
                if e.name.endswith(SUFFIX) and not e.name.startswith("."):
                    with contextlib.suppress(OSError):
                        st = e.stat()
                        blocks[e.name[: -len(SUFFIX)]] = (st.st_mtime, st.st_size)
        owners = records(d)
        out.append(DirScan(d, blocks, owners, {k for _, keys in owners.values() for k in keys}))
    return out


def remove_stale_temps(*dirs: Path) -> None:
    now = time.time()
    for sub in dirs:
        with contextlib.suppress(OSError):
            for e in os.scandir(sub):
                if e.name.startswith(".") and e.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        if now - e.stat().st_mtime > STALE_TEMP_S:
                            os.unlink(e.path)
