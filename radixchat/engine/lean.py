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


def _norm(module: nn.Module, kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module.forward`` for float32 activations, in its ops (the gemma weight's ``1 + w`` computed once)."""
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    weight = module.weight
    if kind == "gemma":
        weight = 1.0 + module.weight.float()
    generic = module.forward

    def norm(x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32 or weight.dtype != torch.float32:
            return generic(x)
        x_hat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x_hat if kind == "llama" else x_hat * weight

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
        self.final_norm = _norm(inner.norm, arch.norm)
        self.head = model.lm_head.forward
        self.softcap = getattr(config, "final_logit_softcapping", None)

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


def lean_forward(model: nn.Module) -> LeanForward | None:
    """The lean forward of ``model``, or None where its architecture is not one we know (transformers runs it)."""
    arch = ARCHS.get(getattr(model.config, "model_type", ""))
    rope = getattr(inspect.getmodule(type(model)), "apply_rotary_pos_emb", None)
    if arch is None or rope is None or not hasattr(model, "model") or not hasattr(model, "lm_head"):
        return None
    return LeanForward(model, arch, rope)
