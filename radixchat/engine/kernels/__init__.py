"""Native CPU kernels: built once per machine from the C++ sources beside this file, then loaded.

``paged_attention.cpp`` registers ``torch.ops.radixchat.paged_decode``: decode attention that reads each
sequence's K/V from the pool through its slot row, in place, in any of the pool's dtypes. It is compiled with
the machine's own vector extensions (``-march=native``) by the C++ compiler that inductor needs too, into
``<cache_dir>/kernels/<key>/``, where the key covers the source, torch's version and the CPU. The build takes
a few seconds, once (``scripts/setup.sh`` runs it ahead); a later start only loads the library.

``int4.cpp`` registers the products with quantized weights: ``torch.ops.radixchat.int4_gemv``, a few rows times a
packed model's 4-bit codes, for decode steps (``weights.py``'s ``int4-gemv`` kernel);
``torch.ops.radixchat.int4_dequant``, those codes unpacked into a bfloat16 matrix at memory speed, for prefill
chunks (the ``int4-bf16`` kernel); ``torch.ops.radixchat.int4_dot8``, those codes times activations rounded to 8
bits, in integer dot products, for packed models' chat turns and prefill chunks (the ``int4-dot8`` kernel);
``torch.ops.radixchat.int8_gemv``, a few rows times 8-bit codes with a scale per 32 inputs, for LM heads (the
``int8`` kernel); and ``torch.ops.radixchat.int8_dot8``, 8-bit codes with a scale and a minimum per 32 inputs
times activations rounded to 8 bits, for the int8 format's layers (the ``int8-dot8`` kernel).

Where it cannot be built (no compiler, another platform) the engine keeps its portable path (gather, then
SDPA) and says so in its stats; nothing else changes.

``decode_step.cpp`` registers ``torch.ops.radixchat.decode_step``: a whole pure-decode forward of a known
architecture (``lean.py`` builds its arguments), the lean forward's layer loop without its Python, bit for bit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# One library: the paged attention, the products with quantized weights (``int4.cpp``) and the native decode
# step that calls both (``decode_step.cpp``).
SOURCES = tuple(
    Path(__file__).with_name(name) for name in ("paged_attention.cpp", "int4.cpp", "decode_step.cpp")
)
_lock = threading.Lock()
_state: dict[str, str | None] = {}  # "paged_decode" -> None (loaded) or why not


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "radixchat" / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return name
    return None


def _key(cxx: str) -> str:
    from radixchat.machine import cpu_isa, cpu_name

    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    h = hashlib.sha256()
    for part in (
        *(src.read_bytes() for src in SOURCES),
        torch.__version__.encode(),
        cpu_name().encode(),
        cpu_isa().encode(),
    ):
        h.update(part)
    h.update(version.splitlines()[0].encode() if version else b"")
    return h.hexdigest()[:20]


def _build(cxx: str, target: Path) -> None:
    from torch.utils import cpp_extension

    includes = [f"-isystem{p}" for p in cpp_extension.include_paths()]
    libdirs = cpp_extension.library_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    cmd = [
        cxx,
        "-O3",
        "-march=native",
        "-fopenmp",  # libgomp.so.1: the one torch has loaded already, so its thread pool is shared
        "-fPIC",
        "-shared",
        "-std=c++17",
        "-D_GLIBCXX_USE_CXX11_ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)),
        *includes,
        *map(str, SOURCES),
        "-o",
        str(tmp),
        *[f"-L{d}" for d in libdirs],
        "-lc10",
        "-ltorch_cpu",
        *[f"-Wl,-rpath,{d}" for d in libdirs],
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            first = next((line for line in out.stderr.splitlines() if "error" in line), out.stderr[-300:])
            raise RuntimeError(f"{cxx} failed: {first.strip()}")
        os.replace(tmp, target)  # another process may have built it meanwhile: the same bytes, atomically
    finally:
        tmp.unlink(missing_ok=True)


def load_paged_attention(cache_dir: Path | None = None) -> str | None:
    """Build (once per machine) and load the paged decode attention; None when it is ready, else why not.

    Safe to call many times and from several processes at once."""
    with _lock:
        if "paged_decode" in _state:
            return _state["paged_decode"]
        why = _load(Path(cache_dir) / "kernels" if cache_dir is not None else default_dir())
        if why is not None:
            log.warning("paged attention kernel unavailable (%s); decode gathers K/V instead", why)
        _state["paged_decode"] = why
        return why


def _load(root: Path) -> str | None:
    if sys.platform != "linux":
        return "native kernels are built on Linux only"
    if hasattr(torch.ops.radixchat, "paged_decode"):  # loaded by another engine of this process
        return None
    cxx = _compiler()
    if cxx is None:
        return "no C++ compiler (g++)"
    key = _key(cxx)
    target = root / key / "paged_attention.so"
    if not target.is_file() and (default_dir() / key / target.name).is_file():
        target = default_dir() / key / target.name  # built by scripts/setup.sh, or for another cache dir
    try:
        if not target.is_file():
            log.info("building the paged attention kernel for this CPU (once)")
            _build(cxx, target)
        torch.ops.load_library(str(target))
    except Exception as exc:  # a failed build or a damaged library: the portable path still works
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
    _register_fake()
    return None


def _register_fake() -> None:
    """Shapes for tracing (the compiled decode step exports the op as a call, not as its code)."""

    @torch.library.register_fake("radixchat::paged_decode")
    def _(q, k, v, slots, lens, scale, window):  # noqa: ANN001, ANN202
        return q.new_empty(q.shape).contiguous()

    @torch.library.register_fake("radixchat::int4_dequant")
    def _(packed, sz, out):  # noqa: ANN001, ANN202
        return out

    @torch.library.register_fake("radixchat::int4_gemv")
    def _(x, packed, sz):  # noqa: ANN001, ANN202
        return x.new_empty((x.shape[0], sz.shape[1]), dtype=torch.float32)

    @torch.library.register_fake("radixchat::int4_dot8")
    def _(x, packed, sz):  # noqa: ANN001, ANN202
        return x.new_empty((x.shape[0], sz.shape[1]), dtype=torch.float32)

    @torch.library.register_fake("radixchat::int8_gemv")
    def _(x, codes, scales):  # noqa: ANN001, ANN202
        return x.new_empty((x.shape[0], codes.shape[0] * codes.shape[2]), dtype=torch.float32)

    @torch.library.register_fake("radixchat::int8_dot8")
    def _(x, codes, scales):  # noqa: ANN001, ANN202
        return x.new_empty((x.shape[0], codes.shape[0] * codes.shape[2]), dtype=torch.float32)


def native_ready() -> bool:
    """Whether the products with quantized weights (``int4_gemv``, ``int4_dot8``, ``int4_dequant``, ``int8_gemv``)
    are loaded (by ``load_paged_attention``, which builds the one library of native kernels)."""
    return _state.get("paged_decode", "not loaded") is None and hasattr(torch.ops.radixchat, "int8_gemv")


def decode_step_ready() -> bool:
    """Whether the native decode step (``decode_step.cpp``) is loaded."""
    return native_ready() and hasattr(torch.ops.radixchat, "decode_step")


def paged_attention_ready() -> bool:
    return _state.get("paged_decode", "not loaded") is None
