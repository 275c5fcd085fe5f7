"""Weights formats: how the linear layers store and multiply their weights.

The transformers model code is never touched. ``apply_weights`` swaps each ``nn.Linear`` of the loaded model
for a ``FormatLinear`` that keeps the original weight (the exact path) and, beside it, the compact copies its
other kernels need. Every call picks its kernel by how many rows it multiplies: one per stream in a decode
step, hundreds in a prefill chunk. Which kernel is fastest for which row count differs from machine to machine
(a 4-bit kernel that wins on an AVX-512 CPU loses badly on an AVX2 one), so a short probe measures them on the
model's own weights at first start, and the result is cached by CPU model and torch version.

Kernels (a format is the set of kernels it may use):

- ``float32``  the model's own weights, ``F.linear`` (the exact path; also used by every format for the row
  counts where it is fastest, typically large prefill chunks);
- ``bfloat16`` / ``float16``  a half-precision copy, activations rounded to it;
- ``int4``  4-bit weights in groups of 32 with a scale and a minimum per group (asymmetric, as GGUF's Q4_1),
  through PyTorch's CPU int4 matmul with bfloat16 activations. For a model that was shipped as Q4_1 (the
  bundled SmolLM2) the 4-bit codes are recovered exactly; the group scales and the output round to bfloat16.

- ``int4-gemv``  the same 4-bit codes through a native product (``kernels/int4.cpp``) for a few rows.
- ``int8-dot8``  8-bit codes with a scale and a minimum per group of 32 inputs (256 levels: a Q4_1 group's 16 are
  every 17th; a 5- or 6-bit GGUF weight, Gemma 3's Q5_0 and Q6_K, moves by at most half an 8-bit step), times
  the activations rounded to 8 bits per 16 inputs, in integer dot products (``kernels/int4.cpp``): llama.cpp's
  numerics for a GGUF's 8-bit weights, at every row count, and four times bfloat16's products per instruction.

``auto`` takes int4 only for layers already on its grid (``on_int4_grid``: a Q4_1 file's), never requantizing
to 4 bits; int8 is always among its choices (its quality guard: ``tests/engine/test_weights.py``).
The LM head is the exception: every format computes it in int8 (8-bit codes and a scale per 32 inputs, as
GGUF's Q8_0, float32 sums: a Q8_0 head's exact values), float16 or float32 (see ``HEAD_FORMATS``).

A *packed* model (``packed.py``: a model too big to keep a float32 copy of) has no float32 weights at all: its
layers hold only the int4 codes (memory-mapped from disk; float16 where the file stored more than 4 bits) and
its head float16, or the file's own int4 codes where the file stored it in 4 bits. Its format ``packed``
has four layer kernels: ``int4``; ``int4-gemv``, a native product of a few rows with the codes
(``kernels/int4.cpp``) that streams them at memory speed, for decode steps; ``int4-dot8``, the same codes times
the activations rounded to 8 bits per 16 inputs, in integer dot products (AVX-512 VNNI: twice int4-gemv's
products per instruction, for chat turns of tens of rows and prefill chunks, where int4-gemv is compute-bound);
and ``int4-bf16``, which unpacks a layer's codes into a reused bfloat16 matrix (native too) and multiplies in
bfloat16. The probe picks among them per row count, as for any format. int4-dot8 is the packed format's only:
8-bit activations are how llama.cpp multiplies a GGUF's 4-bit weights (per 32 inputs there), so a model a person
brings keeps at least llama.cpp's precision, while the bundled model's ``int4`` format keeps int4-gemv's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from radixchat.errors import ConfigError
from radixchat.machine import cpu_load, trusted_timings, write_probe

log = logging.getLogger(__name__)

KERNELS = ("float32", "bfloat16", "float16", "int4", "int4-gemv", "int8", "int8-dot8")
PACKED = "packed"
#: What a packed model's probe times: its layers' four kernels and its head's float16.
PACKED_KERNELS = ("int4-gemv", "int4-dot8", "int4", "int4-bf16", "float16")
# Each format may use these kernels (the probe picks one per row count among them).
FORMATS: dict[str, tuple[str, ...]] = {
    "float32": ("float32",),
    "bfloat16": ("bfloat16", "float32"),
    "float16": ("float16", "bfloat16", "float32"),
    "int8": ("int8-dot8", "bfloat16", "float32"),
    "int4": ("int4", "int4-gemv", "bfloat16", "float32"),
    PACKED: ("int4-gemv", "int4-dot8", "int4", "int4-bf16"),
}
WEIGHTS_CHOICES = ("auto", *FORMATS)
_LAYER_KERNELS = {k for kernels in FORMATS.values() for k in kernels}
# The LM head's output is the logits: rounded to bfloat16 (8-bit mantissa) or computed from 4-bit weights, the
# top-1 token flips far more often than with float16. So the head keeps at least float16, or int8: 8-bit codes
# with a scale per 32 inputs (GGUF's Q8_0), products and sums in float32. A head read from a Q8_0 tensor (both
# real models store their embedding so) keeps that tensor's exact values in int8, at half float16's bytes.
HEAD_KERNELS = ("int8", "float16", "float32")
#: The head's kernels per format. With int4 layers the logits stay float32 (or int8): the 4-bit layers use up
#: the quality guard's budget, and a float16 head on top of them falls below it.
HEAD_FORMATS: dict[str, tuple[str, ...]] = {
    "float32": ("float32",),
    "bfloat16": HEAD_KERNELS,
    "float16": HEAD_KERNELS,
    "int8": HEAD_KERNELS,
    "int4": ("int8", "float32"),
    # A packed model keeps no float32 copy: its head is float16 (as the float16 and bfloat16 formats' is), or
    # the file's own 4-bit codes where the file stores the head (or the tied embedding) in 4 bits.
    PACKED: ("int4-gemv", "int4", "float16"),
}
#: A lossy kernel is planned instead of float32 only when it is at least this much faster: a smaller gain
#: is within the probe's noise and not worth the precision.
EXACT_MARGIN = 0.10
INT4_GROUP = 32
# Row counts the probe measures; a call with m rows uses the choice of the smallest bucket >= m.
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
HEAD_BUCKETS = (1, 2, 4, 8, 16, 32)  # the LM head only sees the rows that sample (logits_to_keep)


# -- kernels ----------------------------------------------------------------------------------------------


def _half(dtype: torch.dtype) -> Callable[[FormatLinear, torch.Tensor], torch.Tensor]:
    attr = f"w_{str(dtype).removeprefix('torch.')}"

    def mm(layer: FormatLinear, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x.to(dtype), getattr(layer, attr)).to(x.dtype)
        return out if layer.bias is None else out + layer.bias

    return mm


def _int4_mm(layer: FormatLinear, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, layer.in_features).to(torch.bfloat16)
    out = torch._weight_int4pack_mm_for_cpu(rows, layer.w_int4, INT4_GROUP, layer.sz_int4)
    out = out.reshape(*x.shape[:-1], layer.out_features).to(x.dtype)
    return out if layer.bias is None else out + layer.bias


def _native(op: str, buffer: str) -> Callable[[FormatLinear, torch.Tensor], torch.Tensor]:
    """A native product (``kernels/int4.cpp``) of the rows with a layer's ``w_<buffer>`` and ``sz_<buffer>``."""

    codes, scales = f"w_{buffer}", f"sz_{buffer}"

    def mm(layer: FormatLinear, x: torch.Tensor) -> torch.Tensor:
        product = getattr(torch.ops.radixchat, op)  # the library loads after import: looked up per call
        out = product(x.reshape(-1, layer.in_features), getattr(layer, codes), getattr(layer, scales))
        out = out.reshape(*x.shape[:-1], layer.out_features).to(x.dtype)
        return out if layer.bias is None else out + layer.bias

    return mm


_scratch = threading.local()  # each thread's bfloat16 buffer for int4-bf16 (the widest layer it has unpacked)


def _int4_bf16_mm(layer: FormatLinear, x: torch.Tensor) -> torch.Tensor:
    n, k = layer.out_features, layer.in_features
    buf = getattr(_scratch, "w", None)
    if buf is None or buf.numel() < n * k:
        buf = _scratch.w = torch.empty(n * k, dtype=torch.bfloat16)
    wt = torch.ops.radixchat.int4_dequant(layer.w_int4, layer.sz_int4, buf[: n * k].view(k, n))  # [K, N]
    out = F.linear(x.reshape(-1, k).to(torch.bfloat16), wt.t()).reshape(*x.shape[:-1], n).to(x.dtype)
    return out if layer.bias is None else out + layer.bias


def _dense_mm(layer: FormatLinear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


def _dense_mm_rows8(layer: FormatLinear, x: torch.Tensor) -> torch.Tensor:
    """float32 with at least 8 rows: the BLAS multiplies fewer rows on another path (a matrix-vector
    product) whose sums run in another order, so a row's result would depend on how many rows came with
    it. Deterministic plans use this instead of ``float32``."""
    rows = x.reshape(-1, layer.in_features)
    n = rows.shape[0]
    if n < 8:
        rows = torch.cat([rows, rows.new_zeros(8 - n, layer.in_features)])
    out = F.linear(rows, layer.weight, layer.bias)[:n]
    return out.reshape(*x.shape[:-1], layer.out_features)


_MM: dict[str, Callable[[FormatLinear, torch.Tensor], torch.Tensor]] = {
    "float32": _dense_mm,
    "float32x8": _dense_mm_rows8,
    "bfloat16": _half(torch.bfloat16),
    "float16": _half(torch.float16),
    "int4": _int4_mm,
    "int4-bf16": _int4_bf16_mm,
    "int4-gemv": _native("int4_gemv", "int4"),
    "int4-dot8": _native("int4_dot8", "int4"),
    "int8": _native("int8_gemv", "int8"),
    "int8-dot8": _native("int8_dot8", "u8"),
}
#: The compact copy each kernel multiplies (int4-bf16 unpacks the int4 codes).
_BUFFER = {
    "bfloat16": "bfloat16",
    "float16": "float16",
    "int4": "int4",
    "int4-bf16": "int4",
    "int4-gemv": "int4",
    "int4-dot8": "int4",
    "int8": "int8",
    "int8-dot8": "u8",
}
#: The kernels of the native library (``kernels/int4.cpp``), which a start may fail to build or load.
NATIVE = ("int4-bf16", "int4-gemv", "int4-dot8", "int8", "int8-dot8")


def _grid_fit(w: torch.Tensor, top: int = 15) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes 0..top, scale, minimum) per group of 32 inputs of ``w`` [N, K]: w ~ codes * scale + minimum."""
    groups = w.reshape(w.shape[0], -1, INT4_GROUP)
    lo = groups.amin(-1, keepdim=True)
    scale = ((groups.amax(-1, keepdim=True) - lo) / top).clamp(min=1e-12)
    return ((groups - lo) / scale).round().clamp(0, top), scale, lo


def _pack_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed 4-bit weight, [groups, N, 2] bfloat16 scale and offset) for torch's CPU int4 matmul.

    Per group of 32 inputs: w ~ q * scale + minimum, q in 0..15. The kernel computes (q - 8) * scale + offset,
    so offset = minimum + 8 * scale."""
    n, k = weight.shape
    q, scale, lo = _grid_fit(weight.detach().float())
    packed = torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).reshape(n, k), 1)
    sz = torch.stack([scale.reshape(n, -1), (lo + 8 * scale).reshape(n, -1)], -1)
    return packed, sz.transpose(0, 1).contiguous().to(torch.bfloat16)


_TINY = torch.finfo(torch.float16).tiny  # a group below float16's range gets scale 0: its weights become 0


def _pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [N/64, K, 64] int8, scales [N/64, K/32, 64] float16) for ``int8_gemv``: per group of 32 inputs,
    scale = max |w| / 127 (in float16, as GGUF's Q8_0 stores it) and code = round(w / scale). A weight
    dequantized from Q8_0 gets its own codes and scales back exactly (its largest code is ±127)."""
    w = weight.detach().float()
    n, k = w.shape
    groups = w.reshape(n, k // INT4_GROUP, INT4_GROUP)
    scale = (groups.abs().amax(-1) / 127).to(torch.float16)
    codes = (groups / scale.float().clamp(min=_TINY)[..., None]).round().clamp(-127, 127)
    codes = codes.to(torch.int8).reshape(n // 64, 64, k).transpose(1, 2).contiguous()
    return codes, scale.reshape(n // 64, 64, -1).transpose(1, 2).contiguous()


def _pack_u8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes [N/64, K/4, 64, 4] uint8, scales [N/64, K/32, 2, 64] float32) for ``int8_dot8``: per group of 32
    inputs, 256 levels from the group's minimum to its maximum (w = code * scale + minimum; the scales hold a
    group's 64 scales, then its 64 minimums). A group of a 4-bit grid whose codes span 0..15 (GGUF's Q4_1) keeps
    its values: its 16 levels are every 17th code (float16 scales and minimums would move them off it)."""
    n, k = weight.shape
    codes, scale, lo = _grid_fit(weight.detach().float(), 255)
    codes = codes.to(torch.uint8).reshape(n // 64, 64, k // 4, 4).transpose(1, 2).contiguous()
    sz = torch.cat([scale, lo], -1).reshape(n // 64, 64, k // INT4_GROUP, 2).permute(0, 2, 3, 1)
    return codes, sz.contiguous()


#: A layer is on a 4-bit grid when refitting it to 16 levels per group of 32 changes it by less than this,
#: relative to its mean magnitude (a Q4_1 file's layers: 0; Gemma 3's Q4_K/Q5_0/Q6_K layers: 2-11%).
GRID_TOLERANCE = 1e-3


def on_int4_grid(layers: Iterable[nn.Module], rows: int = 64) -> bool:
    """Whether every layer's weights (its first ``rows`` rows) already sit on the int4 format's grid, so that
    ``int4`` keeps them instead of requantizing them. ``auto`` never requantizes: requantizing Gemma 3's 5-bit
    layers to 4 bits cost a quarter of its top-1 tokens."""
    for layer in layers:
        if layer.weight is None or layer.in_features % INT4_GROUP:
            return False
        w = layer.weight.detach()[:rows].float()
        q, scale, lo = _grid_fit(w)
        groups = w.reshape(q.shape)
        if (q * scale + lo - groups).abs().mean() > GRID_TOLERANCE * groups.abs().mean():
            return False
    return True


def kernel_fits(kernel: str, layer: nn.Module) -> bool:
    """Whether ``kernel`` can multiply ``layer``'s shape (and a packed layer has what it multiplies)."""
    n, k = layer.out_features, layer.in_features
    if layer.weight is None and not hasattr(layer, f"w_{_BUFFER.get(kernel, kernel)}"):
        return False  # a packed layer: only what was stored
    if kernel == "int4":  # torch's int4 matmul takes (scale, offset) pairs, not a packed layer's scales alone
        pairs = getattr(layer, "sz_int4", None) is None or layer.sz_int4.shape[-1] == 2
        return k % INT4_GROUP == 0 and n % 16 == 0 and pairs
    if kernel in NATIVE:  # the native kernels read rows in blocks of 64
        return k % INT4_GROUP == 0 and n % 64 == 0
    return True


_PACKERS = {"int4": _pack_int4, "int8": _pack_int8, "u8": _pack_u8}


def _pack(layer: FormatLinear, kernel: str) -> None:
    kernel = _BUFFER.get(kernel, kernel)
    if kernel in ("float32", "float32x8") or hasattr(layer, f"w_{kernel}"):
        return
    if layer.weight is None:
        raise ValueError(f"a packed layer has no '{kernel}' weights and no float32 ones to make them from")
    if kernel in _PACKERS:
        packed, sz = _PACKERS[kernel](layer.weight)
        layer.register_buffer(f"w_{kernel}", packed, persistent=False)
        layer.register_buffer(f"sz_{kernel}", sz, persistent=False)
    else:
        dtype = getattr(torch, kernel)
        layer.register_buffer(f"w_{kernel}", layer.weight.detach().to(dtype).contiguous(), persistent=False)


def _unpack(layer: FormatLinear, keep: Iterable[str]) -> None:
    if layer.weight is None:
        return  # a packed layer: its buffers are its only weights
    keep = {_BUFFER.get(k, k) for k in keep}
    for kernel in {_BUFFER.get(k, k) for k in KERNELS}:
        if kernel != "float32" and kernel not in keep:
            for name in (f"w_{kernel}", f"sz_{kernel}"):
                if hasattr(layer, name):
                    delattr(layer, name)


_capable: dict[str, str | None] = {}


def kernel_unavailable(kernel: str, device: torch.device) -> str | None:
    """Why ``kernel`` cannot run here (None: it can). Checked once on a tiny product."""
    if kernel == "float32":
        return None
    if device.type != "cpu":
        return "compact weights formats run on the CPU only (on CUDA, use --dtype)"
    if kernel not in _capable:
        try:
            if kernel in NATIVE:
                from radixchat.engine.kernels import load_paged_attention, native_ready

                if not native_ready() and (why := load_paged_attention()) is not None:
                    raise RuntimeError(f"native kernels unavailable ({why})")
            w = torch.randn(64, 2 * INT4_GROUP)
            layer = FormatLinear(nn.Linear(2 * INT4_GROUP, 64, bias=False), "probe")
            layer.weight = nn.Parameter(w, requires_grad=False)
            _pack(layer, kernel)
            x = torch.randn(3, 2 * INT4_GROUP)
            got = _MM[kernel](layer, x)
            assert got.shape == (3, 64) and bool(torch.isfinite(got).all())
            if kernel in NATIVE:  # a native kernel must read its layout as torch multiplies it
                want = _int4_mm(layer, x) if kernel.startswith("int4") else F.linear(x, w)
                assert (got - want).abs().max() <= 0.02 * want.abs().max(), f"{kernel} layout differs"
            _capable[kernel] = None
        except Exception as exc:  # an op missing from this torch build, or a kernel that fails on this CPU
            _capable[kernel] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return _capable[kernel]


def runnable_formats(device: torch.device) -> list[str]:
    """The formats ``auto`` chooses among (a packed model's format is the loader's choice, not the probe's)."""
    return [f for f in FORMATS if f != PACKED and not kernel_unavailable(FORMATS[f][0], device)]


def check_weights_format(fmt: str, device: torch.device) -> None:
    """Raise ConfigError (a usage error) for an unknown format or one this machine cannot run."""
    if fmt not in WEIGHTS_CHOICES:
        raise ConfigError(f"unknown weights format '{fmt}' (choose one of: {', '.join(WEIGHTS_CHOICES)})")
    if fmt != "auto" and (why := kernel_unavailable(FORMATS[fmt][0], device)):
        choices = ", ".join(["auto", *runnable_formats(device)])
        raise ConfigError(
            f"weights format '{fmt}' cannot run on this machine ({why}); choose one of: {choices}"
        )


# -- the swapped linear layer -------------------------------------------------------------------------------


class FormatLinear(nn.Module):
    """A drop-in for ``nn.Linear`` that keeps its weight and picks a kernel per call by row count."""

    def __init__(self, linear: nn.Linear, group: str) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        # The same Parameter: a tied embedding keeps sharing it. None in a packed model (its buffers are all).
        self.weight = None if linear.weight.is_meta else linear.weight
        self.bias = linear.bias
        self.group = group
        self.table: tuple[tuple[int, str], ...] = ((1 << 62, "float32"),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        for max_rows, kernel in self.table:
            if rows <= max_rows:
                return _MM[kernel](self, x)
        return _dense_mm(self, x)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, table={describe_table(self.table)}"


def describe_table(table: Iterable[tuple[int, str]]) -> str:
    """``int4≤16 bfloat16≤64 float32`` (the last kernel takes every larger row count)."""
    parts = []
    table = list(table)
    for i, (max_rows, kernel) in enumerate(table):
        parts.append(kernel if i == len(table) - 1 else f"{kernel}≤{max_rows}")
    return " ".join(parts)


# -- the probe ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WeightsPlan:
    """Which kernel each group of linears uses for each row count, and the format it came from."""

    format: str
    tables: dict[str, tuple[tuple[int, str], ...]]  # group ("layers", "head") -> table

    @property
    def name(self) -> str:
        """``int4 (layers int4≤16 bfloat16, head float16)``: the format and every table. What people see, and
        a stable identity of the numerics (part of KV fingerprints)."""
        if not self.tables:
            return self.format
        return (
            f"{self.format} (" + ", ".join(f"{g} {describe_table(t)}" for g, t in self.tables.items()) + ")"
        )

    def as_json(self) -> dict:
        return {
            "format": self.format,
            "tables": {g: [list(row) for row in t] for g, t in self.tables.items()},
        }

    @classmethod
    def from_json(cls, data: dict) -> WeightsPlan:
        tables = {g: tuple((int(m), str(k)) for m, k in rows) for g, rows in data["tables"].items()}
        return cls(str(data["format"]), tables)


def _groups(model: nn.Module) -> dict[str, list[tuple[nn.Module, str, nn.Linear]]]:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    out: dict[str, list[tuple[nn.Module, str, nn.Linear]]] = {"layers": [], "head": []}
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, (nn.Linear, FormatLinear)):
                out["head" if child is head else "layers"].append((parent, name, child))
    return {g: v for g, v in out.items() if v}


def _signature(groups: dict[str, list[tuple[nn.Module, str, nn.Linear]]]) -> str:
    parts = []
    for g, items in groups.items():
        shapes: dict[tuple[int, int], int] = {}
        for _, _, lin in items:
            key = (lin.out_features, lin.in_features)
            shapes[key] = shapes.get(key, 0) + 1
        parts.append(g + ":" + ",".join(f"{n}x{k}*{c}" for (n, k), c in sorted(shapes.items())))
    return " ".join(parts)


def _sample(items: list[FormatLinear], min_bytes: int) -> list[FormatLinear]:
    """The first linears (in model order) whose float32 weights add up to ``min_bytes``: enough that they
    stream from memory as in a real step, instead of sitting in the last-level cache."""
    out, total = [], 0
    for lin in items:
        out.append(lin)
        total += lin.in_features * lin.out_features * 4
        if total >= min_bytes:
            break
    return out


PROBE_ROUNDS = 6
PROBE_PART_BYTES = 4 << 20  # the head is timed in parts of about this many float32 bytes


class _Rows(nn.Module):
    """Some output rows of a linear, sharing its weight: the probe times the head in such parts, each a
    product as short as a layer's (see ``run_probe``)."""

    def __init__(self, linear: nn.Module, lo: int, hi: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, hi - lo
        w = linear.weight
        self.weight = None if w is None else nn.Parameter(w.detach()[lo:hi], requires_grad=False)
        self.bias = None if linear.bias is None else linear.bias.detach()[lo:hi]
        if w is not None:
            return
        for half in ("float16", "bfloat16"):  # a packed head's only weights
            if hasattr(linear, f"w_{half}"):
                self.register_buffer(f"w_{half}", getattr(linear, f"w_{half}")[lo:hi], persistent=False)
        if hasattr(linear, "w_int4") and lo % 64 == 0 and (hi % 64 == 0 or hi == linear.out_features):
            # int4 rows lie in blocks of 64 (see kernels/int4.cpp): a part of whole blocks is a slice
            half = linear.in_features // 2
            self.register_buffer(
                "w_int4", linear.w_int4.view(-1)[lo * half : hi * half].view(-1, half), False
            )
            self.register_buffer("sz_int4", linear.sz_int4[:, lo:hi].contiguous(), False)


def _parts(linear: nn.Module) -> list[nn.Module]:
    step = max(64, PROBE_PART_BYTES // (linear.in_features * 4) // 64 * 64)
    return [
        _Rows(linear, lo, min(lo + step, linear.out_features)) for lo in range(0, linear.out_features, step)
    ]


def _probe_round(
    layers: list[nn.Module], kernels: list[str], xs: dict[int, torch.Tensor], best: dict[str, list[float]]
) -> None:
    """Time every layer's product with every kernel, layer after layer (the kernels of one layer in turn,
    starting each layer with the next kernel), keeping each (kernel, layer)'s best time in ``best``. Between
    two products of one kernel on one layer, the whole sample's weights stream by, so each reads its
    weights from memory as in a step."""
    clock = time.perf_counter
    for i, lin in enumerate(layers):
        x = xs[lin.in_features]
        for j in range(len(kernels)):
            kernel = kernels[(i + j) % len(kernels)]
            t0 = clock()
            _MM[kernel](lin, x)
            t = clock() - t0
            if t < best[kernel][i]:
                best[kernel][i] = t


def run_probe(
    model: nn.Module,
    kernels: Iterable[str],
    progress: Callable[[str], None] | None = None,
    head_kernels: Iterable[str] = HEAD_KERNELS,
) -> dict:
    """Time every kernel on the model's own weights for every bucket; returns {group: {bucket: {kernel: s}}}.

    Every (kernel, layer) product is timed once per round, the kernels taking turns layer by layer, and
    keeps its best time across the rounds; a kernel's time is the sum of its layers' (the head is timed in
    parts of a few MB, ``_parts``). One product takes well under a scheduler time slice, so on a busy
    machine (another process on every core) most rounds run it undisturbed, and the minimum finds that:
    the choice is the quiet machine's. Whole-sweep totals measured the other work instead, and a probe
    under a CPU hog once chose float32 and decoded at a tenth of the speed."""
    groups = _groups(model)
    kernels = [k for k in kernels if not kernel_unavailable(k, torch.device("cpu"))]
    if progress:
        progress(f"measuring weights formats on this CPU ({', '.join(kernels)}; once)")
    result: dict[str, dict[str, dict[str, float]]] = {}
    with torch.inference_mode():
        for group, items in groups.items():
            # A packed model's float16 layers (stored in more than 4 bits) have one kernel: nothing to choose.
            kept = [
                lin
                for _, _, lin in items
                if group == "head" or lin.weight is not None or hasattr(lin, "w_int4")
            ]
            if not kept:
                continue
            layers = _sample(kept, 96 << 20)
            if group == "head":
                layers = [part for lin in layers for part in _parts(lin)]
            usable = [
                k
                for k in kernels
                if (k in head_kernels if group == "head" else k in _LAYER_KERNELS)
                and all(kernel_fits(k, lin) for lin in layers)
            ]
            for lin in layers:
                for kernel in usable:
                    _pack(lin, kernel)
            for rows in HEAD_BUCKETS if group == "head" else BUCKETS:
                # Large row counts are compute-bound: a few layers tell as much as all of them.
                sample = layers if rows <= 64 else layers[: max(1, len(layers) // 8)]
                xs = {k: torch.randn(rows, k) for k in {lin.in_features for lin in sample}}
                best = {k: [float("inf")] * len(sample) for k in usable}
                for _ in range(1 + PROBE_ROUNDS):  # the first round is also the warm-up
                    _probe_round(sample, usable, xs, best)
                scale = len(layers) / len(sample)
                result.setdefault(group, {})[str(rows)] = {k: sum(t) * scale for k, t in best.items()}
            for lin in layers:
                _unpack(lin, ())
    return result


#: A deterministic plan has one kernel per group for every row count (a token's result may not depend on how
#: many rows share its product: decode streams, prefill chunks). Its choice weighs a 512-row prefill product's
#: time per row this many times against a one-row decode product's: prompts are prefilled once, replies
#: are decoded token by token.
UNIFORM_PREFILL_ROWS = 8


def _uniform_cost(kernel: str, buckets: dict, group: str) -> float:
    one = buckets["1"].get("float32" if kernel == "float32x8" else kernel, float("inf"))
    if kernel == "float32x8":
        one = buckets.get("8", {}).get("float32", float("inf"))  # one row is multiplied as eight
    if group == "head":  # the head multiplies only the rows that sample
        return one
    widest = max(buckets, key=int)
    per_row = buckets[widest].get("float32" if kernel == "float32x8" else kernel, float("inf")) / int(widest)
    return one + UNIFORM_PREFILL_ROWS * per_row


def uniform_plan(
    fmt: str,
    timings: dict,
    device: torch.device,
    invariant: dict[str, set[str]],
    formats: Iterable[str] | None = None,
) -> WeightsPlan:
    """The deterministic plan: per group one kernel for every row count, among those whose rows do not
    depend on the rows beside them on this machine (``invariant``: group -> kernels, ``row_invariant``);
    ``auto`` takes the format with the cheapest (decode + weighted prefill) step among ``formats`` (default:
    every runnable one)."""
    if fmt == "auto":
        plans = []
        for f in runnable_formats(device) if formats is None else formats:
            try:
                plans.append(uniform_plan(f, timings, device, invariant))
            except ConfigError:
                continue
        if not plans:
            raise ConfigError(
                "no weights kernel on this machine gives rows that do not depend on their batch"
            )
        return min(plans, key=lambda p: (_uniform_step(p, timings), len(FORMATS[p.format])))
    tables = {}
    for group, buckets in timings.items():
        allowed = [
            "float32x8" if k == "float32" else k
            for k in (FORMATS[fmt] if group != "head" else HEAD_FORMATS[fmt])
        ]
        usable = [k for k in allowed if k in invariant.get(group, set())]
        if not usable:
            raise ConfigError(f"weights format '{fmt}' has no batch-invariant kernel for the {group} here")
        best = min(usable, key=lambda k: _uniform_cost(k, buckets, group))
        tables[group] = ((1 << 62, best),)
    return WeightsPlan(fmt, tables)


def _uniform_step(plan: WeightsPlan, timings: dict) -> float:
    return sum(_uniform_cost(t[0][1], timings[g], g) for g, t in plan.tables.items())


def row_invariant(layer: FormatLinear, kernel: str) -> bool:
    """Whether ``kernel`` gives each row of a product the same bits however many rows come with it, checked
    on ``layer``'s own shape (libraries pick their code path by shape and CPU)."""
    if not kernel_fits(kernel, layer) or kernel_unavailable(kernel.removesuffix("x8"), layer.weight.device):
        return False
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, layer.in_features, generator=g)
    _pack(layer, kernel)
    mm = _MM[kernel]
    with torch.inference_mode():
        full = mm(layer, x)
        parts = [mm(layer, x[i : i + 1]) for i in (0, 7, 23)] + [mm(layer, x[:3]), mm(layer, x[:9])]
    return (
        torch.equal(parts[0][0], full[0])
        and torch.equal(parts[1][0], full[7])
        and torch.equal(parts[2][0], full[23])
        and torch.equal(parts[3], full[:3])
        and torch.equal(parts[4], full[:9])
    )


def _invariant_kernels(layers: list[FormatLinear]) -> set[str]:
    """The kernels whose rows do not depend on their batch for every shape of ``layers`` (a library may pick
    another algorithm for another shape: oneDNN's bfloat16 product is batch-invariant for SmolLM2's
    576-wide inputs and not for its 1536-wide ones)."""
    shapes: dict[tuple[int, int], FormatLinear] = {}
    for layer in layers:
        shapes.setdefault((layer.out_features, layer.in_features), layer)
    out = set()
    for kernel in (*KERNELS, "float32x8"):
        if kernel != "float32" and all(row_invariant(layer, kernel) for layer in shapes.values()):
            out.add(kernel)
    for layer in shapes.values():
        _unpack(layer, ())
    return out


def plan_from_probe(
    fmt: str, timings: dict, device: torch.device, formats: Iterable[str] | None = None
) -> WeightsPlan:
    """The fastest kernel per bucket among the format's kernels; ``auto`` takes the format with the fastest
    single-stream decode step (layers and head at one row) among ``formats`` (default: every runnable one)."""
    if fmt == "auto":
        measured = timings.get("layers", {}).get("1", {})
        candidates = runnable_formats(device) if formats is None else formats
        plans = [plan_from_probe(f, timings, device) for f in candidates if FORMATS[f][0] in measured]
        return min(plans, key=lambda p: (_step_time(p, timings), len(FORMATS[p.format])))
    tables = {}
    for group, buckets in timings.items():
        rows: list[tuple[int, str]] = []
        for bucket in sorted(buckets, key=int):
            allowed = set(FORMATS[fmt] if group != "head" else HEAD_FORMATS[fmt])
            options = {k: t for k, t in buckets[bucket].items() if k in allowed}
            best = min(options, key=options.__getitem__) if options else "float32"
            if "float32" in options and options[best] > options["float32"] * (1 - EXACT_MARGIN):
                best = "float32"  # a near tie goes to the exact product
            if rows and rows[-1][1] == best:
                rows[-1] = (int(bucket), best)
            else:
                rows.append((int(bucket), best))
        rows[-1] = (1 << 62, rows[-1][1])
        tables[group] = tuple(rows)
    return WeightsPlan(fmt, tables)


def _step_time(plan: WeightsPlan, timings: dict) -> float:
    total = 0.0
    for group, table in plan.tables.items():
        total += timings[group]["1"].get(table[0][1], float("inf"))
    return total


def load_or_probe(
    model: nn.Module,
    cache_dir: Path,
    device: torch.device,
    progress=None,  # noqa: ANN001
    formats: Iterable[str] | None = None,
    hold: bool = False,
) -> dict:
    """The probe's timings for this machine and these model shapes: measured once, then cached.

    A probe taken while the machine was busy (other work on every core: its kernels' times are the
    scheduler's, and ``auto`` once picked a much slower format that way) is used only until a
    start finds the machine quiet: that start measures again and replaces it. ``hold`` (a deterministic
    start, whose plan decides its reply's bits): any cached probe is used."""
    groups = _groups(model)
    packed = any(lin.weight is None for items in groups.values() for _, _, lin in items)
    kernels = PACKED_KERNELS if packed else KERNELS
    # the kernels are part of the key: a start with a new kernel measures it instead of reusing a probe without it
    scale_only = any(
        lin.sz_int4.shape[-1] == 1
        for items in groups.values()
        for _, _, lin in items
        if hasattr(lin, "sz_int4")
    )
    signature = (
        _signature(groups)
        + (" " + PACKED if packed else "")
        + (" scale-only" if scale_only else "")
        + " ["
        + ",".join(kernels)
        + "]"
    )
    load = cpu_load()
    cached = trusted_timings(cache_dir, signature, load, hold)
    if cached is not None:
        return cached
    if packed:
        timings = run_probe(model, kernels, progress, HEAD_FORMATS[PACKED])
    else:
        timings = run_probe(model, kernels, progress)
    try:
        write_probe(
            cache_dir,
            signature,
            {
                "timings": timings,
                "auto": PACKED if packed else plan_from_probe("auto", timings, device, formats).format,
                "load": round(load, 2),
            },
        )
    except OSError as exc:  # a read-only cache only costs a probe at every start
        log.warning("cannot cache the weights probe in %s: %s", cache_dir, exc)
    return timings


# -- applying a plan ------------------------------------------------------------------------------------------


def apply_weights(
    model: nn.Module,
    fmt: str,
    device: torch.device,
    cache_dir: Path,
    progress=None,  # noqa: ANN001
    deterministic: bool = False,
) -> WeightsPlan:
    """Swap the model's linears for FormatLinears following the plan for ``fmt`` on this machine.
    ``deterministic``: one batch-invariant kernel per group for every row count (``uniform_plan``)."""
    check_weights_format(fmt, device)
    if device.type != "cpu" or (fmt == "auto" and model.dtype != torch.float32):
        return WeightsPlan("float32", {})
    if fmt == "float32" and not deterministic:
        return WeightsPlan("float32", {})
    groups = _swap(model)
    # auto takes int4 only for layers already on its grid (a Q4_1 file's): it never requantizes
    grid = fmt != "auto" or on_int4_grid(groups.get("layers", []))
    formats = [f for f in runnable_formats(device) if grid or f != "int4"]
    timings = load_or_probe(model, cache_dir, device, progress, formats, hold=deterministic)
    if deterministic:
        invariant = {g: _invariant_kernels(layers) for g, layers in groups.items()}
        plan = uniform_plan(fmt, timings, device, invariant, formats)
    else:
        plan = plan_from_probe(fmt, timings, device, formats)
    install_plan(model, plan)
    return plan


def _swap(model: nn.Module) -> dict[str, list[FormatLinear]]:
    swapped: dict[str, list[FormatLinear]] = {}
    for group, items in _groups(model).items():
        swapped[group] = []
        for parent, name, lin in items:
            layer = lin if isinstance(lin, FormatLinear) else FormatLinear(lin, group)
            setattr(parent, name, layer)
            swapped[group].append(layer)
    return swapped


def install_plan(model: nn.Module, plan: WeightsPlan) -> None:
    """Give every linear its group's table and the compact copies that table uses (and no others)."""
    for group, layers in _swap(model).items():
        table = plan.tables.get(group, ((1 << 62, "float32"),))
        # a deterministic (one-kernel) table falls back to the batch-invariant float32 product
        fallback = "float32x8" if len(table) == 1 and table[0][1] != "float32" else "float32"
        for layer in layers:
            usable = tuple((m, k if _runs(k, layer) else _fallback(layer, k, fallback)) for m, k in table)
            layer.table = usable
            for _, kernel in usable:
                _pack(layer, kernel)
            _unpack(layer, (k for _, k in usable))


def _runs(kernel: str, layer: FormatLinear) -> bool:
    """Whether ``kernel`` fits the layer and runs in this process (a cached plan may name a native kernel that
    this start could not load)."""
    device = torch.device("cpu") if layer.weight is None else layer.weight.device
    return kernel_fits(kernel, layer) and (
        kernel.startswith("float32") or not kernel_unavailable(kernel, device)
    )


def _fallback(layer: FormatLinear, kernel: str, fallback: str) -> str:
    """The kernel a layer uses where its plan's ``kernel`` cannot multiply its shape: ``fallback`` (float32),
    or for a packed layer what it has (int4 codes in rows not a multiple of 64, or float16)."""
    if layer.weight is not None:
        return fallback
    return next(k for k in ("int4", "int4-gemv", "float16") if kernel_fits(k, layer))
