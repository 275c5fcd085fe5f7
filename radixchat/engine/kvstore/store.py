"""The KV store: blocks of token paths on disk, below the radix tree (the fourth memory level).

Layout under ``root`` (``<cache_dir>/kv``), one directory per model fingerprint::

    <fingerprint>/blocks/<key>.safetensors   one block of a token path (see blocks.py)
    <fingerprint>/owners/<hash>.json         an owner's saved path: {"owner", "keys", "tokens"}

Owners are what front ends name (a session): an owner's record lists the blocks of the path it saved
last, so a later save supersedes an earlier one and blocks no owner needs any more are deleted. Blocks
without an owner (the spill tier's) are a plain cache. Every file is written atomically (temp file,
fsync when durable, rename); files are immutable once written and named by their content's key, so two
processes sharing the directory can only ever race to write the same bytes.

The budget covers the whole root (every model): when it is exceeded, unowned blocks go first, least
recently used first, then whole owner paths, least recently used first. A file's mtime is its last use
(reads touch it); a path's is that of its record or its last block, which is its own (the first blocks
are often a system prompt that every session shares, and touched by each of them).

Nothing here runs torch: the engine's thread encodes blocks from the pool and copies verified blocks into
it (``tier.py``); this class only indexes, reads, writes and deletes files. It is thread-safe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from radixchat.engine.kvstore.blocks import (
    BLOCK_TOKENS,
    SUFFIX,
    BadBlock,
    BlockInfo,
    Expect,
    block_info,
    chain_key,
    check,
    file_name,
    full_block_keys,
    root_key,
)
from radixchat.engine.kvstore.files import (
    atomic_write,
    fingerprint_dirs,
    mtime,
    owner_file,
    read_record,
    records,
    remove_stale_temps,
    scan_root,
)

log = logging.getLogger(__name__)

MAX_NOTICES = 20


@dataclass(frozen=True, slots=True)
class OwnerUsage:
    tokens: int  # tokens of the owner's saved path that are on disk for this model
    bytes: int  # disk bytes of the blocks the path uses (shared blocks count for each owner)
    last_used: float  # unix time of the last save or load


@dataclass(frozen=True, slots=True)
class KVStoreUsage:
    """The disk store as front ends may show it (for the current model)."""

    owners: dict[str, OwnerUsage]  # owners with KV for this model ("warm" sessions)
    total_bytes: int  # everything under the store's root, all models
    budget_bytes: int
    unowned_bytes: int  # this model's blocks no owner needs (spilled from the pool)
    notices: tuple[str, ...] = field(default=())  # recent one-line notices (bad files found, ...)


class KVStore:
    def __init__(self, root: Path, expect: Expect, budget_bytes: int) -> None:
        self.root = Path(root)
        self.expect = expect
        self.budget_bytes = budget_bytes
        self.root_key = root_key(expect.fingerprint)
        self.dir = self.root / expect.fingerprint
        self.blocks_dir = self.dir / "blocks"
        self.owners_dir = self.dir / "owners"
        self.blocks_dir.mkdir(parents=True, exist_ok=True)
        self.owners_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._blocks: dict[str, BlockInfo] = {}
        self._children: dict[str, list[BlockInfo]] = {}
        self._seen_mtime = -1
        self.notices: deque[str] = deque(maxlen=MAX_NOTICES)
        self._total = 0
        remove_stale_temps(self.blocks_dir, self.owners_dir)
        self.refresh()
        self._total = self._scan_root_bytes()

    # -- index ----------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Pick up blocks written or deleted by other processes (cheap when nothing changed)."""
        with self._lock:
            # An unreadable directory (gone, replaced by a file, no permission) reads as unchanged:
            # the store then finds nothing new, and requests compute their KV as usual.
            try:
                mtime = self.blocks_dir.stat().st_mtime_ns
                if mtime == self._seen_mtime:
                    return
                names = {
                    e.name[: -len(SUFFIX)]
                    for e in os.scandir(self.blocks_dir)
                    if e.name.endswith(SUFFIX) and not e.name.startswith(".")
                }
            except OSError:
                return
            self._seen_mtime = mtime
            for key in set(self._blocks) - names:
                self._unindex(self._blocks[key])
            for key in names - set(self._blocks):
                path = self.blocks_dir / file_name(key)
                try:
                    self._index(block_info(path, key, self.root_key))
                except FileNotFoundError:
                    continue
                except (BadBlock, OSError) as exc:
                    self._delete_bad(path, str(exc))

    def _index(self, info: BlockInfo) -> None:
        self._blocks[info.key] = info
        self._children.setdefault(info.parent, []).append(info)

    def _unindex(self, info: BlockInfo) -> None:
        self._blocks.pop(info.key, None)
        siblings = self._children.get(info.parent, [])
        with contextlib.suppress(ValueError):
            siblings.remove(info)
        if not siblings:
            self._children.pop(info.parent, None)

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def total_bytes(self) -> int:
        """Bytes under the root as this process last counted them (others' writes show after a scan)."""
        return self._total

    def find(self, parent: str, seg: Sequence[int]) -> BlockInfo | None:
        """A stored block under ``parent`` whose ids start with ``seg`` (it holds ``seg``'s KV)."""
        with self._lock:
            if len(seg) == BLOCK_TOKENS:
                return self._blocks.get(chain_key(parent, seg))
            want = tuple(seg)
            for info in self._children.get(parent, ()):
                if info.ids[: len(want)] == want:
                    return info
        return None

    def lookup(self, ids: Sequence[int], have: int) -> list[tuple[BlockInfo, int, int]]:
        """Stored blocks that continue ``ids`` past its first ``have`` tokens, longest chain first.

        Returns ``(block, lo, hi)`` triples: positions ``block.start + lo .. block.start + hi - 1`` are
        new, contiguous from ``have``. Empty if the store has nothing past ``have``."""
        if not self._blocks or have >= len(ids):
            return []
        j = have // BLOCK_TOKENS
        with self._lock:
            parent = full_block_keys(self.root_key, ids, j)[-1] if j else self.root_key
            out: list[tuple[BlockInfo, int, int]] = []
            pos = j * BLOCK_TOKENS
            while pos < len(ids):
                seg = ids[pos : pos + BLOCK_TOKENS]
                best, k = self._longest(parent, seg)
                if best is None or pos + k <= have:
                    break
                out.append((best, max(have - pos, 0), k))
                if k < BLOCK_TOKENS:
                    break
                parent, pos = best.key, pos + BLOCK_TOKENS
        return out

    def _longest(self, parent: str, seg: Sequence[int]) -> tuple[BlockInfo | None, int]:
        if len(seg) == BLOCK_TOKENS:
            exact = self._blocks.get(chain_key(parent, seg))
            if exact is not None:
                return exact, BLOCK_TOKENS
        best, k = None, 0
        for info in self._children.get(parent, ()):
            n = 0
            for a, b in zip(seg, info.ids):
                if a != b:
                    break
                n += 1
            if n > k:
                best, k = info, n
        return best, k

    # -- reading --------------------------------------------------------------------------------------

    def read(self, info: BlockInfo) -> bytearray:
        """The block's bytes (raises OSError, FileNotFoundError if it was deleted meanwhile)."""
        path = self.blocks_dir / file_name(info.key)
        with open(path, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            f.readinto(data)
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used is by mtime
        return data

    def check(self, data: bytearray, info: BlockInfo) -> tuple[int, int]:
        return check(data, self.expect, info)

    def discard(self, info: BlockInfo, reason: str) -> str:
        """Delete a block that failed its checks; return (and remember) the one-line notice."""
        with self._lock:
            self._unindex(info)
            return self._delete_bad(self.blocks_dir / file_name(info.key), reason)

    def _delete_bad(self, path: Path, reason: str) -> str:
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            path.unlink()
            self._total -= size
        return self.notice(f"KV store: ignored {path.name[:12]}…: {reason}; it is recomputed instead")

    def notice(self, text: str) -> str:
        log.warning("%s", text)
        self.notices.append(text)
        return text

    # -- writing --------------------------------------------------------------------------------------

    def write(
        self, key: str, parent: str, start: int, ids: Sequence[int], data: bytes, durable: bool
    ) -> BlockInfo:
        """Store an encoded block (raises OSError; nothing is indexed then)."""
        path = self.blocks_dir / file_name(key)
        atomic_write(path, data, durable)
        info = BlockInfo(key, parent, start, tuple(ids), len(data))
        with self._lock:
            if key not in self._blocks:
                self._index(info)
                self._total += len(data)
        return info

    def make_room(
        self, nbytes: int, protect: Iterable[str] = (), evict_owners: bool = True, saving: str | None = None
    ) -> bool:
        """Make the store fit ``nbytes`` more within its budget, evicting least recently used paths.

        Unowned blocks go first; then, if ``evict_owners``, whole owner paths other than ``saving``'s.
        Blocks in ``protect`` (the path being saved) are never deleted, even when an evicted owner
        shared them. Returns whether the bytes now fit."""
        with self._lock:
            if self._total + nbytes <= self.budget_bytes:
                return True
            protect = set(protect)
            dirs = scan_root(self.root)
            self._total = sum(b[1] for d in dirs for b in d.blocks.values())
            unowned = sorted(
                ((mtime, d, key, size) for d in dirs for key, (mtime, size) in d.blocks.items()),
                key=lambda t: t[0],
            )
            for _, d, key, size in unowned:
                if key in d.refs or key in protect:
                    continue
                if self._total + nbytes <= self.budget_bytes:
                    return True
                self._delete_block(d.path, key, size)
            if not evict_owners:
                return self._total + nbytes <= self.budget_bytes
            paths = sorted(
                (
                    (max([mtime] + [d.blocks[k][0] for k in keys[-1:] if k in d.blocks]), d, owner)
                    for d in dirs
                    for owner, (mtime, keys) in d.owners.items()
                    if not (owner == saving and d.path == self.dir)
                ),
                key=lambda t: t[0],
            )
            for _, d, owner in paths:
                if self._total + nbytes <= self.budget_bytes:
                    return True
                self._delete_owner_in(d.path, owner, keep=protect)
            return self._total + nbytes <= self.budget_bytes

    # -- owners ---------------------------------------------------------------------------------------

    def set_owner(self, owner: str, keys: Sequence[str], tokens: int) -> None:
        """Record ``owner``'s path (durably); blocks only its previous path used are deleted."""
        path = self.owners_dir / owner_file(owner)
        record = {"owner": owner, "keys": list(keys), "tokens": tokens}
        old = read_record(path)
        atomic_write(path, json.dumps(record).encode(), durable=True)  # outside the lock: fsync is slow
        if old is not None:
            with self._lock:
                self._drop_unreferenced(self.dir, set(old["keys"]) - set(keys))

    def delete_owner(self, owner: str) -> int:
        """Forget ``owner`` for every model; delete the blocks no other owner uses. Returns bytes freed."""
        freed = 0
        with self._lock:
            for d in fingerprint_dirs(self.root):
                freed += self._delete_owner_in(d, owner)
        return freed

    def rename_owner(self, old: str, new: str) -> bool:
        """Move ``old``'s paths (every model) to ``new``, replacing any paths ``new`` had."""
        if old == new:
            return self.owner_keys(old) is not None
        moved = False
        with self._lock:
            for d in fingerprint_dirs(self.root):
                src = d / "owners" / owner_file(old)
                record = read_record(src)
                if record is None:
                    continue
                self._delete_owner_in(d, new, keep=set(record["keys"]))
                record["owner"] = new
                atomic_write(d / "owners" / owner_file(new), json.dumps(record).encode())
                src.unlink(missing_ok=True)
                moved = True
        return moved

    def owner_keys(self, owner: str) -> list[str] | None:
        record = read_record(self.owners_dir / owner_file(owner))
        return None if record is None else list(record["keys"])

    def usage(self) -> KVStoreUsage:
        with self._lock:
            self.refresh()
            owners: dict[str, OwnerUsage] = {}
            owned: set[str] = set()
            for path in self.owners_dir.glob("*.json"):
                record = read_record(path)
                if record is None:
                    continue
                keys = record["keys"]
                owned.update(keys)
                present = list(self._present_prefix(keys))
                if not present:
                    continue
                tokens = min(int(record.get("tokens", 0)), present[-1].end)
                used = max(mtime(path), mtime(self.blocks_dir / file_name(present[-1].key)))
                owners[record["owner"]] = OwnerUsage(tokens, sum(b.nbytes for b in present), used)
            unowned = sum(b.nbytes for k, b in self._blocks.items() if k not in owned)
            return KVStoreUsage(owners, self._total, self.budget_bytes, unowned, tuple(self.notices))

    def _present_prefix(self, keys: Sequence[str]) -> Iterable[BlockInfo]:
        for key in keys:
            info = self._blocks.get(key)
            if info is None:
                return
            yield info

    # -- files of any fingerprint directory (the budget and deletions cover every model) ----------------

    def _delete_owner_in(self, d: Path, owner: str, keep: Iterable[str] = ()) -> int:
        path = d / "owners" / owner_file(owner)
        record = read_record(path)
        if record is None:
            return 0
        path.unlink(missing_ok=True)
        return self._drop_unreferenced(d, set(record["keys"]).difference(keep))

    def _drop_unreferenced(self, d: Path, keys: set[str]) -> int:
        if not keys:
            return 0
        for _, other in records(d).values():
            keys.difference_update(other)
        freed = 0
        for key in keys:
            path = d / "blocks" / file_name(key)
            with contextlib.suppress(OSError):
                freed += self._delete_block(d, key, path.stat().st_size)
        return freed

    def _delete_block(self, d: Path, key: str, size: int) -> int:
        try:
            (d / "blocks" / file_name(key)).unlink()
        except OSError:
            return 0
        self._total -= size
        if d == self.dir and key in self._blocks:
            self._unindex(self._blocks[key])
        return size

    def _scan_root_bytes(self) -> int:
        return sum(size for d in scan_root(self.root) for _, size in d.blocks.values())
