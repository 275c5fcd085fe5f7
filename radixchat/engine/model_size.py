"""Whether a model fits this machine's memory, told before anything is loaded.

The engine loads weights as float32 (a GGUF is dequantized into float32 safetensors once), so a model
needs about four bytes per parameter of memory while it loads. Counting the parameters costs nothing:
a GGUF's tensor table and safetensors' headers give every shape without reading the weights. A model that
cannot fit is one line naming what it needs and what there is, instead of a process the OS kills minutes in.
"""

from __future__ import annotations

import functools
import math
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
            from gguf import GGUFReader

            return sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)
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
