"""The KV store's unit on disk: one block of a token path, in a safetensors file.

A token path is cut every ``BLOCK_TOKENS`` positions. Block ``j`` holds the K/V of positions
``j*B .. j*B + n - 1`` (``n <= B``; a partial block ends a path) and is named by a chain key::

    key(block j) = H(key(block j-1) || ids of block j),   key(block -1) = the store's root key

so a key names a block's tokens *and* every token before them: two paths share exactly their common
blocks, and a block can only ever be used at the one place in the one token path it was computed for.
The root key hashes the model fingerprint, so another model's blocks have other names too.

File layout: one tensor ``kv`` of shape ``[num_layers, 2 (K, V), n, num_kv_heads, head_dim]`` in the KV
pool's own dtype, and text metadata: the format, the fingerprint, the block's key and its parent's key,
its start position, its token ids and a CRC-32 of the tensor bytes. ``check`` verifies all of that
without torch (so it can run on any thread); ``kv_tensor`` then wraps the verified bytes as a tensor.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FORMAT = "radixchat-kv/1"
BLOCK_TOKENS = 64
SUFFIX = ".safetensors"
MAX_HEADER_BYTES = 1 << 20  # a block's header is a few KiB; anything larger is not ours

# torch dtype name -> safetensors dtype code (the dtypes a KV pool can have)
DTYPE_CODES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


class BadBlock(Exception):
    """A block file that must not be used; the message says why in a few words."""


@dataclass(frozen=True, slots=True)
class Expect:
    """What a block of this store must look like (checked before any byte reaches the pool)."""

    fingerprint: str
    dtype: str  # torch dtype name, e.g. "float32"
    num_layers: int
    num_kv_heads: int
    head_dim: int

    def shape(self, n: int) -> list[int]:
        return [self.num_layers, 2, n, self.num_kv_heads, self.head_dim]


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A stored block, as the index knows it (from the file's header)."""

    key: str
    parent: str
    start: int
    ids: tuple[int, ...]
    nbytes: int  # file size

    @property
    def end(self) -> int:
        return self.start + len(self.ids)


def root_key(fingerprint: str) -> str:
    return hashlib.blake2b(f"{FORMAT}:{BLOCK_TOKENS}:{fingerprint}".encode(), digest_size=16).hexdigest()


def chain_key(parent: str, ids: Sequence[int]) -> str:
    h = hashlib.blake2b(parent.encode(), digest_size=16)
    h.update(np.asarray(ids, dtype="<i4").tobytes())
    return h.hexdigest()


def full_block_keys(root: str, ids: Sequence[int], n_blocks: int) -> list[str]:
    """Keys of the first ``n_blocks`` full blocks of ``ids`` (which must have that many)."""
    keys, parent = [], root
    for j in range(n_blocks):
        parent = chain_key(parent, ids[j * BLOCK_TOKENS : (j + 1) * BLOCK_TOKENS])
        keys.append(parent)
    return keys


def file_name(key: str) -> str:
    return key + SUFFIX


# -- writing (the tensor comes from the pool, on the engine's thread) ----------------------------------


def encode(kv, *, fingerprint: str, key: str, parent: str, start: int, ids: Sequence[int]) -> bytes:  # noqa: ANN001
    """Serialize a block: ``kv`` is a contiguous CPU tensor ``[L, 2, n, H, D]``."""
    import torch
    from safetensors.torch import save

    raw = kv.reshape(-1).view(torch.uint8).numpy()
    meta = {
        "format": FORMAT,
        "fingerprint": fingerprint,
        "key": key,
        "parent": parent,
        "start": str(start),
        "ids": ",".join(map(str, ids)),
        "crc32": str(zlib.crc32(raw)),
    }
    return save({"kv": kv}, metadata=meta)


# -- reading --------------------------------------------------------------------------------------------


def _parse_header(head: bytes) -> dict:
    try:
        header = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadBlock("unreadable header") from None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise BadBlock("no radixchat metadata")
    return header


def read_header(path: Path) -> tuple[dict, dict]:
    """(metadata, the kv tensor's entry) of a block file, reading only its header. Raises BadBlock."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        head_len = _header_len(f.read(8), size)
        header = _parse_header(f.read(head_len))
    return header["__metadata__"], _tensor_entry(header)


def _header_len(prefix: bytes, size: int) -> int:
    if len(prefix) < 8:
        raise BadBlock("truncated (no header)")
    (n,) = struct.unpack("<Q", prefix)
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise BadBlock("truncated or not a safetensors file")
    return n


def _tensor_entry(header: dict) -> dict:
    entry = header.get("kv")
    if not isinstance(entry, dict) or set(header) != {"kv", "__metadata__"}:
        raise BadBlock("unexpected tensors")
    return entry


def block_info(path: Path, expect_key: str, root: str) -> BlockInfo:
    """Index entry of a block file: its header must name this key and agree with its own ids."""
    meta, _ = read_header(path)
    info = _info_from(meta, path.stat().st_size)
    if info.key != expect_key:
        raise BadBlock("file name does not match its key")
    if (info.start == 0) != (info.parent == root):
        raise BadBlock("belongs to another model's store")
    return info


def _info_from(meta: dict, nbytes: int) -> BlockInfo:
    if meta.get("format") != FORMAT:
        raise BadBlock(f"format {meta.get('format')!r}, expected {FORMAT}")
    try:
        ids = tuple(int(t) for t in meta["ids"].split(",")) if meta["ids"] else ()
        start, key, parent = int(meta["start"]), meta["key"], meta["parent"]
    except (KeyError, ValueError, AttributeError):
        raise BadBlock("incomplete metadata") from None
    if not ids or len(ids) > BLOCK_TOKENS or start < 0 or start % BLOCK_TOKENS:
        raise BadBlock("impossible block geometry")
    if chain_key(parent, ids) != key:
        raise BadBlock("token ids do not match the key")
    return BlockInfo(key, parent, start, ids, nbytes)


def check(data: bytes | bytearray, expect: Expect, info: BlockInfo) -> tuple[int, int]:
    """Verify a whole block file's bytes against the store and the index entry it was read for.

    Returns the (begin, end) byte range of the tensor data. Raises BadBlock naming what is wrong:
    truncation, another model or dtype, a wrong shape, or corrupted bytes (CRC-32)."""
    head_len = _header_len(bytes(data[:8]), len(data))
    header = _parse_header(bytes(data[8 : 8 + head_len]))
    meta, entry = header["__metadata__"], _tensor_entry(header)
    if meta.get("fingerprint") != expect.fingerprint:
        raise BadBlock("computed by another model, dtype or weights format")
    got = _info_from(meta, len(data))
    if (got.key, got.parent, got.start, got.ids) != (info.key, info.parent, info.start, info.ids):
        raise BadBlock("header changed since it was indexed")
    code = DTYPE_CODES.get(expect.dtype)
    if entry.get("dtype") != code:
        raise BadBlock(f"dtype {entry.get('dtype')}, expected {code}")
    if entry.get("shape") != expect.shape(len(got.ids)):
        raise BadBlock(f"shape {entry.get('shape')}, expected {expect.shape(len(got.ids))}")
    try:
        begin, end = (8 + head_len + int(o) for o in entry["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise BadBlock("no data offsets") from None
    itemsize = 2 if code in ("F16", "BF16") else 8 if code == "F64" else 4
    if end != len(data) or end - begin != itemsize * int(np.prod(expect.shape(len(got.ids)))):
        raise BadBlock("truncated")
    if str(zlib.crc32(memoryview(data)[begin:end])) != meta.get("crc32"):
        raise BadBlock("checksum mismatch (corrupted)")
    return begin, end


def kv_tensor(data: bytearray, span: tuple[int, int], expect: Expect, n: int):  # noqa: ANN201
    """The verified block bytes as a ``[L, 2, n, H, D]`` tensor (a view of ``data``, no copy)."""
    import torch

    dtype = getattr(torch, expect.dtype)
    begin, end = span
    flat = torch.frombuffer(data, dtype=torch.uint8, count=end - begin, offset=begin)
    return flat.view(dtype).view(expect.shape(n))
