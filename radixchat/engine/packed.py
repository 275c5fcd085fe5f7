"""Packed models: a GGUF converted tensor by tensor into the engine's runtime format, kept on disk, memory-mapped.

A model whose float32 copy would crowd the machine (``use_packed``; float32 takes about seven times a Q4_0
file's bytes) is never dequantized whole. ``convert`` reads the GGUF one tensor at a time (gguf-py maps the
file), dequantizes that tensor, and stores it as the engine multiplies it:

- a linear layer stored in 4 bits (Q4_0, Q4_1, Q4_K) as its own codes, in torch's CPU int4 layout, with its
  group scales and minimums as bfloat16 per group of 32 (read from the blocks, never requantized); a symmetric
  format's layer (Q4_0: every offset 0) keeps the scales alone, which only the native kernels read;
- a linear layer stored in more bits (Q5_0, Q5_K, Q6_K, Q8_0, F16, BF16), or whose shape int4 cannot hold, as
  float16: requantizing it to 4 bits failed the quality guard (on Gemma 3's Q5_0 tensors);
- the token embedding as float16 (a lookup touches only its rows); the LM head as the file's int4 codes where
  the file stores it (or the embedding it is tied to) in 4 bits, else float16 (a tied head then multiplies
  the embedding's own rows);
- norms and biases as float32.

The result is one ``weights.pt`` (``torch.save``) beside the config and tokenizer, in
``<cache_dir>/models/<name>-<key>-packed/``. ``load`` maps it (``torch.load(mmap=True)``): a start reads only
the pages it touches, and the pages are the page cache's, shared with any other process that maps them (the
compiled-step builder). The int4 layout is the one this machine's torch packs; the marker records a
fingerprint of it, and a file packed elsewhere is converted again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import mmap
from pathlib import Path
from typing import Any

import torch
from torch import nn

from radixchat.engine import weights as W
from radixchat.engine.attention import ATTN_NAME
from radixchat.engine.model_dir import build_once, file_key
from radixchat.engine.model_size import GIB, available_memory, parameter_count
from radixchat.errors import ModelLoadError

PACKED_MARKER = "radixchat-packed.json"
WEIGHTS_FILE = "weights.pt"
FORMAT_VERSION = 2  # 2: scale-only group scales for symmetric (Q4_0) layers
#: A model is packed when its float32 copy would take more than this share of the memory available: the
#: float32 path (exact, and the fastest prefill) stays for models that fit it easily.
FLOAT32_SHARE = 0.125


def _row_processors() -> tuple[type, ...]:
    """transformers' GGUF tensor processors that only permute a weight's rows (or leave it): a tensor's codes
    and group scales can go through them as its weights do."""
    from transformers.modeling_gguf_pytorch_utils import (
        Gemma2TensorProcessor,
        LlamaTensorProcessor,
        TensorProcessor,
    )

    return (TensorProcessor, LlamaTensorProcessor, Gemma2TensorProcessor)


def use_packed(gguf: Path) -> bool:
    """Whether ``weights = auto`` packs this GGUF: its float32 copy would take more than ``FLOAT32_SHARE`` of
    the memory available now (never the bundled 135M model on a machine that runs the app)."""
    params = parameter_count(gguf)
    return params is not None and params * 4 > FLOAT32_SHARE * available_memory()


def packed_bytes(params: int) -> int:
    """About what a packed model of ``params`` parameters holds: 4-bit codes with 16-bit scales and offsets
    per 32 (0.625 bytes a parameter), with room for a float16 embedding and the loader's own needs."""
    return int(params * 0.9) + GIB // 2


def layout_fingerprint() -> str:
    """A hash of how this machine's torch lays out int4 codes (the int4 matmul's packing is CPU-specific)."""
    codes = (torch.arange(128 * 64, dtype=torch.int32).reshape(128, 64) * 7) % 16
    packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    return hashlib.sha1(packed.numpy().tobytes()).hexdigest()[:12]


def packed_dir(gguf: Path, cache_dir: Path, name: str) -> Path:
    return cache_dir / "models" / f"{name}-{file_key(gguf, f':{FORMAT_VERSION}')}-packed"


def is_packed(path: Path) -> bool:
    return (path / PACKED_MARKER).is_file()


def _current(target: Path) -> bool:
    try:
        marker = json.loads((target / PACKED_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("version") == FORMAT_VERSION and marker.get("layout") == layout_fingerprint()


def convert(gguf: Path, cache_dir: Path, name: str, progress: Any = None) -> Path:
    """Pack ``gguf`` once (see the module docstring); return the packed model's directory."""
    target = packed_dir(gguf, cache_dir, name)
    if _current(target):
        return target
    params = parameter_count(gguf) or 0
    need, have = packed_bytes(params), available_memory()
    if need > have:
        raise ModelLoadError(
            f"{name} needs about {need / GIB:.1f} GiB of memory ({params / 1e9:.2f} B parameters as int4) "
            f"and this machine has {have / GIB:.1f} GiB available"
        )

    def write(tmp: Path) -> None:
        _write(gguf, tmp)
        marker = {"source": str(gguf), "version": FORMAT_VERSION, "layout": layout_fingerprint()}
        (tmp / PACKED_MARKER).write_text(json.dumps(marker))

    doing = f"packing {gguf.name} for this CPU (int4, one time) ..."
    return build_once(target, write, _current, source=gguf, verb="pack", doing=doing, progress=progress)


def _skeleton(config: Any, attn: str = ATTN_NAME) -> nn.Module:
    """The model with its parameters on the meta device (no memory) and its buffers (RoPE) real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float32)


def _linears(model: nn.Module) -> dict[str, str]:
    """``{weight name: group}`` of the model's linear layers (``layers`` or ``head``)."""
    names = {id(mod): name for name, mod in model.named_modules()}
    return {
        f"{names[id(lin)]}.weight": group for group, items in W._groups(model).items() for _, _, lin in items
    }


def _write(gguf: Path, out: Path) -> None:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = _skeleton(config)
    reader = GGUFReader(str(gguf))
    arch = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    with _cached_name_maps():
        mapping = get_gguf_hf_weights_map(model, processor)
    linears = _linears(model)
    embed = f"{_name_of(model, model.get_input_embeddings())}.weight"
    tensors: dict[str, torch.Tensor] = {}
    rows_only = type(processor) in _row_processors()
    params = {"config": config.to_dict(), "tensors": tensors}

    def process(array: np.ndarray, name: str) -> Any:
        return processor.process(
            weights=array, name=name, tensor_key_mapping=mapping, parsed_parameters=params
        )

    head = next((name for name, group in linears.items() if group == "head"), None)
    # tied: the file has no tensor of the head's own, the head is the embedding
    tied = head is not None and all(mapping.get(t.name) != head for t in reader.tensors)
    for tensor in reader.tensors:
        hf = mapping.get(tensor.name)
        module = (head if hf == embed and tied else hf or "").removesuffix(".weight")
        codes = _int4_codes(tensor) if rows_only and (hf in linears or (hf == embed and tied)) else None
        if codes is not None and W.kernel_fits("int4", _stub(*codes[0].shape)):
            # The file's own 4-bit codes and group scales, rows permuted as the processor permutes weights.
            q, scale, low = (process(a, tensor.name).weights for a in codes)
            w_int4, sz = _pack_codes(q, scale, low)
            tensors[f"{module}.w_int4"], tensors[f"{module}.sz_int4"] = w_int4, _scale_only(sz)
            del q, scale, low, codes
            if hf != embed:
                _drop_pages(reader)
                continue
        result = process(dequantize(tensor.data, tensor.tensor_type), tensor.name)
        if result.name not in mapping:
            continue
        hf = mapping[result.name]
        module = hf.removesuffix(".weight")
        value = torch.from_numpy(np.require(result.weights, np.float32, ["C", "W"]))
        if hf in linears or hf == embed:  # a layer with more than 4 bits, the embedding, an untied head
            tensors[f"{module}.w_float16"] = value.to(torch.float16)
        else:
            tensors[hf] = value.clone()
        del value, result
        _drop_pages(reader)
    torch.save(tensors, out / WEIGHTS_FILE)
    config.save_pretrained(out)
    with contextlib.suppress(Exception):  # a config without generation fields: the defaults apply
        GenerationConfig.from_model_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def _cached_name_maps() -> Any:
    """transformers builds gguf-py's tensor name map anew for every submodule it walks (seconds for a
    model); the map depends only on the architecture and the layer count."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def _stub(n: int, k: int) -> nn.Module:
    return nn.Linear(k, n, bias=False, device="meta")


def _drop_pages(reader: Any) -> None:
    """Let go of the GGUF pages read so far (the page cache keeps them): the process's memory holds one
    tensor of the file at a time, not all of it."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        reader.data._mmap.madvise(mmap.MADV_DONTNEED)


def _int4_codes(tensor: Any) -> tuple[Any, Any, Any] | None:
    """A Q4_0, Q4_1 or Q4_K tensor's own codes ``[N, K]`` and, per group of 32, the scale and the minimum
    (weight = code * scale + minimum), read from its blocks without dequantizing; None for other types."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf.quants import Q4_K

    kind = tensor.tensor_type
    if kind not in (T.Q4_0, T.Q4_1, T.Q4_K):
        return None
    n = int(tensor.shape[1]) if len(tensor.shape) == 2 else 0
    if not n:
        return None
    size = {T.Q4_0: 18, T.Q4_1: 20, T.Q4_K: 144}[kind]
    blocks = np.asarray(tensor.data).reshape(-1, size)
    d = blocks[:, :2].view(np.float16).astype(np.float32)
    if kind == T.Q4_K:
        dmin = blocks[:, 2:4].view(np.float16).astype(np.float32)
        sc, m = Q4_K.get_scale_min(blocks[:, 4:16])
        scale, low = d * sc.astype(np.float32), -dmin * m.astype(np.float32)  # [blocks, 8]
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    else:
        scale = d
        low = blocks[:, 2:4].view(np.float16).astype(np.float32) if kind == T.Q4_1 else -8 * d
        qs = blocks[:, size - 16 :].reshape(-1, 1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(
            1, 1, 2, 1
        )
    codes = (qs & np.uint8(15)).reshape(n, -1)
    return codes, scale.reshape(n, -1), low.reshape(n, -1)


def _pack_codes(codes: Any, scale: Any, low: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``weights._pack_int4``'s result from codes and group scales that are given, not fitted."""
    q = torch.from_numpy(codes.astype("int32"))
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)
    s, lo = torch.from_numpy(scale), torch.from_numpy(low)
    sz = torch.stack([s, lo + 8 * s], -1)  # the kernel computes (code - 8) * scale + offset
    return packed, sz.transpose(0, 1).contiguous().to(torch.bfloat16)


def _scale_only(sz: torch.Tensor) -> torch.Tensor:
    """``sz`` without its offsets ([groups, N, 1]) where every offset is 0 (a symmetric format's groups: Q4_0)
    and the native kernels, the only ones that read that layout, multiply the layer: a decode step reads a tenth
    fewer bytes. Else ``sz`` as it is."""
    fits = sz.shape[1] % 64 == 0 and W.kernel_unavailable("int4-gemv", torch.device("cpu")) is None
    return sz[..., :1].contiguous() if fits and not sz[..., 1].any() else sz


def with_offsets(sz: torch.Tensor) -> torch.Tensor:
    """A scale-only ``sz`` with its zero offsets back, for torch's int4 matmul (which takes only pairs)."""
    return sz if sz.shape[-1] == 2 else torch.cat([sz, torch.zeros_like(sz)], -1)


def _name_of(model: nn.Module, module: nn.Module) -> str:
    return next(name for name, mod in model.named_modules() if mod is module)


class HalfEmbedding(nn.Module):
    """The token embedding of a packed model: the original module (Gemma's scales its output) over float16
    rows, its output in float32. The rows live in a buffer, so the float16 table is not a parameter (the
    model's dtype stays float32) and a tied head can share it."""

    def __init__(self, inner: nn.Module, rows: torch.Tensor) -> None:
        super().__init__()
        del inner.weight
        inner.register_buffer("weight", rows, persistent=False)
        self.inner = inner
        self.num_embeddings, self.embedding_dim = rows.shape

    @property
    def weight(self) -> torch.Tensor:
        return self.inner.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner(ids).float()


def load(path: Path, attn: str = ATTN_NAME) -> nn.Module:
    """The packed model in ``path``, its weights memory-mapped, every linear a ``FormatLinear`` without a
    float32 weight (``weights.install_plan`` then gives them their tables). ``attn``: tests load an sdpa
    reference copy."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    model = _skeleton(config, attn)
    state = torch.load(path / WEIGHTS_FILE, mmap=True, weights_only=True)
    embedding = model.get_input_embeddings()
    embed_name = _name_of(model, embedding)
    rows = state.pop(f"{embed_name}.w_float16")
    wrapper = HalfEmbedding(embedding, rows)
    parent_name, _, child = embed_name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, wrapper)
    groups = W._swap(model)
    names = {id(mod): name for name, mod in model.named_modules()}
    for group, layers in groups.items():
        for layer in layers:
            name = names[id(layer)]
            if group == "head" and not any(f"{name}.{k}" in state for k in ("w_float16", "w_int4")):
                # tied, in more than 4 bits: the head multiplies the embedding's own float16 rows
                layer.register_buffer("w_float16", rows, persistent=False)
                continue
            for kind in ("w_int4", "sz_int4", "w_float16"):
                if f"{name}.{kind}" in state:
                    layer.register_buffer(kind, state.pop(f"{name}.{kind}"), persistent=False)
            if hasattr(layer, "sz_int4") and W.kernel_unavailable("int4-gemv", torch.device("cpu")):
                # packed where the native kernels ran, started where they cannot be built: torch's int4 matmul
                layer.sz_int4 = with_offsets(layer.sz_int4)
    missing = [k for k, v in model.state_dict().items() if v.is_meta and k not in state]
    if missing:
        raise ModelLoadError(
            f"packed model {path} lacks {len(missing)} tensors (e.g. {missing[0]}): pack it again"
        )
    model.load_state_dict(state, strict=False, assign=True)
    if any(p.is_meta for p in model.parameters()):
        raise ModelLoadError(f"packed model {path} is incomplete: pack it again")
    return model.eval()
