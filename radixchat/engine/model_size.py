"""Whether a model fits this machine's memory, told before anything is loaded.

The engine loads weights as float32 (a GGUF is dequantized into float32 safetensors once), so a model
needs about four bytes per parameter of memory while it loads. Counting the parameters costs nothing:
a GGUF's tensor table and safetensors' headers give every shape without reading the weights. A model that
cannot fit is one line naming what it needs and what there is, instead of a process the OS kills minutes in.
"""

from __future__ import annotations

import functools
import math
import mmap
import struct
from pathlib import Path

import psutil

from radixchat.errors import ModelLoadError

GIB = 1 << 30
FLOAT32_BYTES = 4


def parameter_count(path: Path) -> int | None:
    """The parameters of a .gguf file or of a model directory's safetensors files (None: not known)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _parameter_count(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _parameter_count(path: Path, size: int, mtime_ns: int) -> int | None:  # the file's identity is the key
    try:
        if path.is_file() and path.suffix.lower() == ".gguf":
            return gguf_parameter_count(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
        if not files:
            return None
        from safetensors import safe_open

        total = 0
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                total += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118  (a safe_open handle is not iterable)
        return total
    except Exception:  # an unreadable header: the loader says what is wrong with the file itself
        return None


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value type -> bytes
_STRING, _ARRAY = 8, 9


def gguf_parameter_count(path: Path) -> int:
    """The parameters of a GGUF file, from its header's tensor table. gguf-py's reader parses every metadata
    value into numpy views first, which takes seconds for a large vocabulary: this skips over them."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path.name} is not a GGUF file")
        tensors, kvs = struct.unpack_from("<QQ", data, 8)
        pos = 24

        def skip(kind: int, pos: int) -> int:
            if kind in _SCALAR:
                return pos + _SCALAR[kind]
            if kind == _STRING:
                return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
            if kind == _ARRAY:
                item, count = struct.unpack_from("<IQ", data, pos)
                pos += 12
                if item in _SCALAR:
                    return pos + count * _SCALAR[item]
                for _ in range(count):
                    pos = skip(item, pos)
                return pos
            raise ValueError(f"{path.name}: unknown GGUF value type {kind}")

        for _ in range(kvs):
            pos = skip(_STRING, pos)  # the key
            pos = skip(struct.unpack_from("<I", data, pos)[0], pos + 4)
        total = 0
        for _ in range(tensors):
            pos = skip(_STRING, pos)  # the name
            (dims,) = struct.unpack_from("<I", data, pos)
            shape = struct.unpack_from(f"<{dims}Q", data, pos + 4)
            pos += 4 + 8 * dims + 4 + 8  # dims, then the type and the offset
            total += math.prod(shape)
        return total


def available_memory() -> int:
    """Bytes of memory a new allocation can have: what the OS calls available, within a cgroup's limit."""
    free = psutil.virtual_memory().available
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = int(Path(limit_file).read_text().split()[0])
            usage = int(Path(usage_file).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        free = min(free, max(0, limit - usage))
    return free


def check_fits(path: Path, what: str) -> None:
    """Raise ModelLoadError when the model at ``path`` cannot fit in the memory available now."""
    params = parameter_count(path)
    if params is None:
        return
    need, have = params * FLOAT32_BYTES, available_memory()
    if need > have:
        raise ModelLoadError(
            f"{what} needs about {need / GIB:.1f} GiB of memory ({params / 1e9:.2f} B parameters as float32 "
            f"while it loads) and this machine has {have / GIB:.1f} GiB available"
        )
