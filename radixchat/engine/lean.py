"""The eager forward of the architectures we know, as plain calls: the same modules and the same tensor ops in
the same order as transformers' modeling code, without its wrappers.

A decode step of a small model spends more time in transformers' Python than in its matrix products: each of
~20 modules a layer goes through ``nn.Module.__call__``, keyword plumbing, a config lookup per attribute and,
for some, a kernel-hub shim; masks are built that radix attention never reads (docs/benchmarks.md, section
11). Here the layer loop calls each module's ``forward`` (a norm's arithmetic, op for op) and the modeling
module's own RoPE function directly, and hands radix attention its batch metadata. The logits are
bit-identical to the transformers model's (``tests/engine/test_lean.py``), so everything the engine promises of
that model (greedy equality, batch invariance) holds unchanged. An architecture not listed runs through
transformers.

A pure-decode step goes further where the native kernels are loaded (``decode``): the whole layer loop runs in
``kernels/decode_step.cpp``, called once a step with the weights listed here once per stream count. It calls the
same products, attention and reductions, and does the elementwise arithmetic between them as torch's kernels
round it, so its logits are the lean forward's bit for bit too (``tests/engine/test_lean.py``); a step it cannot
compute (a kernel it does not call, a model in another dtype, an activation or RoPE it does not know) stays here.

The compiled decode step (``decode_graph``) still traces the transformers model: compiled, its wrappers cost
nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from radixchat.engine.attention import AttentionBatch, radix_attention


@dataclass(frozen=True, slots=True)
class _Arch:
    norm: str  # "llama": weight * x_hat; "gemma": x_hat * (1 + weight), both in float32
    sandwich: bool = False  # a norm after attention and after the MLP too (Gemma)
    qk_norm: str | None = None  # per-head norms of q and k: "view" (before the transpose) or "heads" (after)
    window: str = "attn"  # where the sliding window comes from: the attention module, the config, or none


ARCHS = {
    "llama": _Arch("llama", window="none"),
    "mistral": _Arch("llama", window="config"),
    "qwen2": _Arch("llama"),
    "qwen3": _Arch("llama", qk_norm="view"),
    "gemma3_text": _Arch("gemma", sandwich=True, qk_norm="heads"),
}


def _norm_weight(module: nn.Module, kind: str) -> torch.Tensor:
    """The weight a norm's normalized float32 rows are multiplied by (a Gemma norm's ``1 + w``, computed once)."""
    return 1.0 + module.weight.float() if kind == "gemma" else module.weight


def _norm_eps(module: nn.Module) -> float:
    return getattr(module, "variance_epsilon", getattr(module, "eps", None))


def _norm(module: nn.Module, kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module.forward`` for float32 activations, in its ops."""
    eps = _norm_eps(module)
    weight = _norm_weight(module, kind)
    generic = module.forward

    def norm(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            return generic(x)
        x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x_hat if kind == "llama" else x_hat * weight

    norm.weight, norm.eps = weight, eps  # type: ignore[attr-defined]  # what the native decode step reads
    return norm


class _Layer:
    """One decoder layer's modules, looked up once."""

    def __init__(
        self, layer: nn.Module, arch: _Arch, config: object, layer_type: str, rope: Callable[..., Any]
    ) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.attn = attn
        self.rope = rope  # the modeling module's own apply_rotary_pos_emb
        self.layer_type = layer_type
        self.q, self.k, self.v, self.o = (
            m.forward for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        )
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.window = {
            "none": None,
            "config": getattr(config, "sliding_window", None),
            "attn": getattr(attn, "sliding_window", None),
        }[arch.window]
        self.qk_norm = arch.qk_norm
        if arch.qk_norm:
            self.q_norm, self.k_norm = _norm(attn.q_norm, arch.norm), _norm(attn.k_norm, arch.norm)
        self.gate, self.up, self.down = mlp.gate_proj.forward, mlp.up_proj.forward, mlp.down_proj.forward
        self.products = (
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        )
        self.act = mlp.act_fn.forward
        self.sandwich = arch.sandwich
        self.input_norm = _norm(layer.input_layernorm, arch.norm)
        self.post_attn_norm = _norm(layer.post_attention_layernorm, arch.norm)
        if arch.sandwich:
            self.pre_ffn_norm = _norm(layer.pre_feedforward_layernorm, arch.norm)
            self.post_ffn_norm = _norm(layer.post_feedforward_layernorm, arch.norm)

    def attention(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionBatch
    ) -> torch.Tensor:
        shape = (*h.shape[:-1], -1, self.head_dim)
        if self.qk_norm == "view":
            q = self.q_norm(self.q(h).view(shape)).transpose(1, 2)
            k = self.k_norm(self.k(h).view(shape)).transpose(1, 2)
        else:
            q = self.q(h).view(shape).transpose(1, 2)
            k = self.k(h).view(shape).transpose(1, 2)
            if self.qk_norm == "heads":
                q, k = self.q_norm(q), self.k_norm(k)
        v = self.v(h).view(shape).transpose(1, 2)
        q, k = self.rope(q, k, cos, sin)
        out, _ = radix_attention(
            self.attn, q, k, v, None, scaling=self.scaling, sliding_window=self.window, radix=meta
        )
        return self.o(out.reshape(*h.shape[:-1], -1).contiguous())

    def __call__(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionBatch
    ) -> torch.Tensor:
        residual = h
        h = self.attention(self.input_norm(h), cos, sin, meta)
        if self.sandwich:
            h = residual + self.post_attn_norm(h)
            residual = h
            x = self.pre_ffn_norm(h)
            return residual + self.post_ffn_norm(self.down(self.act(self.gate(x)) * self.up(x)))
        h = residual + h
        x = self.post_attn_norm(h)
        return h + self.down(self.act(self.gate(x)) * self.up(x))


class LeanForward:
    """``model(input_ids, position_ids, radix=meta, logits_to_keep=keep).logits`` of a model of a known
    architecture, in fewer Python steps (built once per model: the modules are looked up here)."""

    def __init__(self, model: nn.Module, arch: _Arch, rope: Callable[..., Any]) -> None:
        inner = model.model
        config = model.config
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.per_type = "layer_type" in inspect.signature(inner.rotary_emb.forward).parameters
        types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        self.layers = [
            _Layer(layer, arch, config, types[i], rope)
            for i, layer in enumerate(inner.layers[: config.num_hidden_layers])
        ]
        self.types = {layer.layer_type for layer in self.layers}
        self.types_order = sorted(self.types)  # the native decode step's RoPE tables, in this order
        self.final_norm = _norm(inner.norm, arch.norm)
        self.head = model.lm_head.forward
        self.head_module = model.lm_head
        self.dtype = model.dtype
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self.native = _native_config(self, arch, rope)  # None: this model's decode step stays in Python
        self._native_weights: dict[int, tuple[list[torch.Tensor], list[int]]] = {}

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionBatch, keep: torch.Tensor
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        if self.per_type:
            rope = {t: self.rotary(h, positions, t) for t in self.types}
        else:
            rope = dict.fromkeys(self.types, self.rotary(h, positions))
        for layer in self.layers:
            cos, sin = rope[layer.layer_type]
            h = layer(h, cos, sin, meta)
        logits = self.head(self.final_norm(h)[:, keep, :])
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def decode(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionBatch
    ) -> torch.Tensor | None:
        """The logits ``[1, B, vocab]`` of a pure-decode step (one token per stream, attention reading the pool in
        place: as decode tokens, or as one-token extends in deterministic inference) in native code
        (``kernels/decode_step.cpp``), the same bits as ``__call__``; None where the native step cannot run it
        (then ``__call__`` does)."""
        streams = input_ids.shape[1]
        if self.native is None or not meta.paged:
            return None
        if meta.n_decode == streams and meta.extend_slots is None:
            assert meta.decode_slots is not None and meta.decode_lens is not None
            slots, lens, q_starts, q_lens = meta.decode_slots, meta.decode_lens, _NONE, _NONE
        elif meta.n_decode == 0 and meta.extend_slots is not None and len(meta.extend_slots) == streams:
            # as many extends as tokens: each is one token
            assert meta.extend_kv_lens is not None and meta.extend_q_starts is not None
            slots, lens = meta.extend_slots, meta.extend_kv_lens
            q_starts, q_lens = meta.extend_q_starts, meta.extend_q_lens
        else:
            return None
        weights = self._native_weights.get(streams)
        if weights is None:
            weights = self._native_weights[streams] = _native_weights(self, streams) or ([], [])
        if not weights[0]:
            return None
        layer_rope, cfg, fcfg = self.native
        h = self.embed(input_ids)
        if self.per_type:
            tables = [self.rotary(h, positions, t) for t in self.types_order]
        else:
            tables = [self.rotary(h, positions)]
        rope = [part[0] for cos_sin in tables for part in cos_sin]
        logits = torch.ops.radixchat.decode_step(
            h[0], rope, layer_rope, weights[0], weights[1], meta.pool.k, meta.pool.v,
            meta.out_slots, slots, lens, q_starts, q_lens, cfg, fcfg,
        )  # fmt: skip
        return logits[None]


# -- the native decode step's arguments ------------------------------------------------------------------------

#: weights.py's kernels the native step runs, as its ``Kind`` codes, and the buffers each multiplies.
_NATIVE_KINDS = {
    "int4-gemv": (0, "w_int4", "sz_int4"),
    "int4-dot8": (1, "w_int4", "sz_int4"),
    "int8": (2, "w_int8", "sz_int8"),
    "int8-dot8": (3, "w_u8", "sz_u8"),
    "float16": (4, "w_float16", None),
    "bfloat16": (5, "w_bfloat16", None),
    "float32": (6, "weight", None),
    "float32x8": (7, "weight", None),
}
_NONE = torch.empty(0)  # an absent tensor: a norm or bias the model lacks, an argument the step ignores


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


def _act_code(act: Callable[[torch.Tensor], torch.Tensor]) -> int | None:
    """0: SiLU, 1: GELU's tanh form, None: another activation (told apart by their bits on a probe)."""
    x = torch.linspace(-6, 6, 301)
    y = act(x)
    if _same_bits(y, torch.nn.functional.silu(x)):
        return 0
    if _same_bits(y, torch.nn.functional.gelu(x, approximate="tanh")):
        return 1
    return None


def _standard_rope(rope: Callable[..., Any]) -> bool:
    """Whether the modeling module's RoPE is ``x * cos + rotate_half(x) * sin`` (what the native step computes)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g)
    cos, sin = torch.randn(1, 3, 8, generator=g), torch.randn(1, 3, 8, generator=g)
    got_q, got_k = rope(q, k, cos, sin)

    def want(x: torch.Tensor) -> torch.Tensor:
        half = torch.cat((-x[..., 4:], x[..., :4]), -1)
        return x * cos[:, None] + half * sin[:, None]

    return _same_bits(got_q, want(q)) and _same_bits(got_k, want(k))


def _native_config(lean: LeanForward, arch: _Arch, rope: Callable[..., Any]) -> tuple | None:
    """``(layer_rope, cfg, fcfg)`` of ``decode_step`` for this model, or None where it cannot run it."""
    from radixchat.engine.kernels import decode_step_ready

    layers = lean.layers
    if not decode_step_ready() or not layers or lean.dtype != torch.float32 or not _standard_rope(rope):
        return None
    first = layers[0]
    acts = {_act_code(layer.act) for layer in layers}
    norms = [lean.final_norm] + [n for layer in layers for n in _layer_norms(layer) if n is not None]
    if len(acts) != 1 or None in acts or len({n.eps for n in norms}) != 1:
        return None
    if any(n.weight.dtype != torch.float32 for n in norms) or len({layer.scaling for layer in layers}) != 1:
        return None
    attn = first.attn
    heads = attn.config.num_attention_heads
    kv_heads = attn.config.num_key_value_heads
    layer_rope = [lean.types_order.index(layer.layer_type) if lean.per_type else 0 for layer in layers]
    cfg = [heads, kv_heads, first.head_dim, acts.pop(), int(bool(arch.qk_norm))]
    cfg += [int(layer.window or 0) for layer in layers]
    fcfg = [float(norms[0].eps), float(first.scaling), float(lean.softcap or 0.0)]
    return layer_rope, cfg, fcfg


def _layer_norms(layer: _Layer) -> tuple:
    """A layer's six norms in ``decode_step.cpp``'s order, None where the architecture has none."""
    sandwich = (layer.pre_ffn_norm, layer.post_ffn_norm) if layer.sandwich else (None, None)
    qk = (layer.q_norm, layer.k_norm) if layer.qk_norm else (None, None)
    return (layer.input_norm, layer.post_attn_norm, *sandwich, *qk)


def _product(module: nn.Module, rows: int) -> tuple[int, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(kind, codes or weight, scales, bias) of the kernel ``module`` multiplies ``rows`` rows with."""
    from radixchat.engine.weights import FormatLinear

    kernel = "float32"
    if isinstance(module, FormatLinear):
        kernel = next((k for max_rows, k in module.table if rows <= max_rows), "float32")
    elif not isinstance(module, nn.Linear):
        return None
    if kernel not in _NATIVE_KINDS:
        return None
    kind, a, b = _NATIVE_KINDS[kernel]
    codes = getattr(module, a, None)
    scales = getattr(module, b, None) if b else _NONE
    if codes is None or scales is None or codes.dtype == torch.float32 and kind < 6:
        return None
    bias = module.bias if module.bias is not None else _NONE
    return kind, codes, scales, bias


def _native_weights(lean: LeanForward, rows: int) -> tuple[list[torch.Tensor], list[int]] | None:
    """The weights list and kinds of ``decode_step`` for steps of ``rows`` streams (``decode_step.cpp``)."""
    weights: list[torch.Tensor] = []
    kinds: list[int] = []
    for layer in lean.layers:
        weights += [_NONE if n is None else n.weight for n in _layer_norms(layer)]
        for module in layer.products:
            got = _product(module, rows)
            if got is None:
                return None
            kinds.append(got[0])
            weights += got[1:]
    head = _product(lean.head_module, rows)
    if head is None:
        return None
    kinds.append(head[0])
    weights += [lean.final_norm.weight, *head[1:]]
    return weights, kinds


def lean_forward(model: nn.Module) -> LeanForward | None:
    """The lean forward of ``model``, or None where its architecture is not one we know (transformers runs it)."""
    arch = ARCHS.get(getattr(model.config, "model_type", ""))
    rope = getattr(inspect.getmodule(type(model)), "apply_rotary_pos_emb", None)
    if arch is None or rope is None or not hasattr(model, "model") or not hasattr(model, "lm_head"):
        return None
    return LeanForward(model, arch, rope)
