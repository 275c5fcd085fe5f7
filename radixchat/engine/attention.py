"""The attention function that runs unmodified transformers models over our KV pool.

Registered as ``attn_implementation="radix"``. transformers calls it once per layer with the new tokens'
query ``[1, Hq, T, D]`` and key/value ``[1, Hkv, T, D]`` (RoPE applied, GQA not repeated). The batch is
flattened: the first ``n_decode`` tokens are one decode token per sequence, then each extend (prefill
chunk) sequence's tokens in order. We write K/V into the pool at ``out_slots``, gather each sequence's
full K/V from its slots, and attend with a bottom-right-aligned causal mask (a query at offset ``i`` of a
``q_len`` chunk over ``kv_len`` keys sees keys ``0 .. kv_len - q_len + i``). SDPA's ``is_causal`` is
top-left aligned, so it is used only when there is no cached prefix.

Decode tokens read the pool where it lies, through their slot rows (``torch.ops.radixchat.paged_decode``, a
native kernel built for this CPU: see ``kernels/``); so do prefill chunks over a half-precision pool (the
fast path: ``paged_extend``, with bfloat16 products). Where a kernel is not available, and for prefill on
the exact float32 path, they gather their K/V and run SDPA. The pool may hold K/V in a narrower dtype than
the model computes in (``kv_dtype``): every query attends to K/V as the pool holds them, new tokens'
included, so a token's attention does not depend on whether its keys were written by this step or an
earlier one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from radixchat.engine.kv_pool import KVPool

ATTN_NAME = "radix"
PAGED_HEAD_DIMS = (16, 32, 64, 128, 256)  # what the native kernels are built for


def paged_decode_usable(head_dim: int, device: torch.device) -> bool:
    """Whether attention of this model can read the pool in place here (the kernels are loaded)."""
    from radixchat.engine.kernels import paged_attention_ready

    return device.type == "cpu" and head_dim in PAGED_HEAD_DIMS and paged_attention_ready()


@dataclass(slots=True)
class ExtendSeq:
    q_start: int  # offset of this sequence's first new token in the flat batch
    q_len: int
    kv_len: int  # keys visible to the last query (prefix + new tokens)
    kv_slots: torch.Tensor | None  # [kv_len] slots to gather; None: no prefix, use the new K/V directly
    mask: torch.Tensor | None = None  # [q_len, kv_len] bool, built lazily per window size
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)


@dataclass(slots=True)
class AttentionBatch:
    """Per-step metadata shared by every layer. Built once per forward by the model runner."""

    pool: KVPool
    out_slots: torch.Tensor  # [T] slots the new tokens' K/V go to
    n_decode: int = 0
    decode_slots: torch.Tensor | None = None  # [B, Lmax] gather index (padding points at slot 0)
    decode_lens: torch.Tensor | None = None  # [B] keys per decode sequence (incl. the new token)
    decode_uniform: bool = True  # all decode sequences have the same length: no padding mask
    paged: bool = False  # decode reads the pool in place (the native kernel) instead of gathering
    extends: list[ExtendSeq] = field(default_factory=list)
    # Prefill chunks read the pool in place too, with bfloat16 products (``paged_extend``): set on the fast
    # path (a half-precision pool), never on the exact one. Per extend sequence: its slot row (all of its
    # positions), where its queries start (after the decode tokens), how many, and how many keys it sees.
    extend_slots: torch.Tensor | None = None
    extend_q_starts: torch.Tensor | None = None
    extend_q_lens: torch.Tensor | None = None
    extend_kv_lens: torch.Tensor | None = None
    _decode_masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    def decode_mask(self, window: int | None) -> torch.Tensor | None:
        """[B, 1, 1, Lmax] bool mask for the decode group, or None when every key is visible."""
        if window in self._decode_masks:
            return self._decode_masks[window]
        assert self.decode_slots is not None and self.decode_lens is not None
        lmax = self.decode_slots.shape[1]
        pos = torch.arange(lmax, device=self.decode_lens.device)
        lens = self.decode_lens[:, None]
        mask = None
        if not self.decode_uniform:
            mask = pos[None, :] < lens
        if window is not None and lmax > window:
            in_window = pos[None, :] > (lens - 1 - window)
            mask = in_window if mask is None else mask & in_window
        if mask is not None:
            mask = mask[:, None, None, :]
        self._decode_masks[window] = mask
        return mask


def _extend_mask(seq: ExtendSeq, window: int | None, device: torch.device) -> torch.Tensor | None:
    """Bottom-right causal mask (and sliding window) for one extend sequence; None means is_causal."""
    if window in seq.masks:
        return seq.masks[window]
    prefix = seq.kv_len - seq.q_len
    mask = None
    if prefix > 0 or (window is not None and seq.kv_len > window):
        q_pos = torch.arange(seq.q_len, device=device)[:, None] + prefix
        k_pos = torch.arange(seq.kv_len, device=device)[None, :]
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
    seq.masks[window] = mask
    return mask


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lens: torch.Tensor,
    scaling: float | None,
    window: int | None,
    *,
    paged: bool,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence (``q`` [B, Hq, D]) over the keys ``slots[b, :lens[b]]`` of the pool; returns
    [B, Hq, D] in q's dtype. ``paged``: the native kernel, in place; else gather and SDPA with ``mask``
    (``AttentionBatch.decode_mask``: padding and window)."""
    if paged:
        return torch.ops.radixchat.paged_decode(
            q.float(),
            k_cache,
            v_cache,
            slots,
            lens,
            scaling if scaling is not None else q.shape[-1] ** -0.5,
            window or 0,
        ).to(q.dtype)
    k = k_cache[slots].transpose(1, 2).to(q.dtype)  # [B, Hkv, Lmax, D]
    v = v_cache[slots].transpose(1, 2).to(q.dtype)
    o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scaling, enable_gqa=True)
    return o[:, :, 0, :]


def radix_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    radix: AttentionBatch | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    if radix is None:
        raise RuntimeError("radix attention called without batch metadata (use the engine's model runner)")
    if softcap is not None:
        raise RuntimeError("attention logit softcapping is not supported by radix attention")
    if kwargs.get("s_aux") is not None:
        raise RuntimeError("attention sinks are not supported by radix attention")
    layer = module.layer_idx
    pool = radix.pool
    k_cache, v_cache = pool.k[layer], pool.v[layer]
    q = query[0]  # [Hq, T, D]
    k_new = key[0].transpose(0, 1)  # [T, Hkv, D]
    v_new = value[0].transpose(0, 1)
    k_cache.index_copy_(0, radix.out_slots, k_new.to(k_cache.dtype))
    v_cache.index_copy_(0, radix.out_slots, v_new.to(v_cache.dtype))
    narrow = k_cache.dtype != query.dtype  # attend to K/V as the pool holds them

    num_tokens = q.shape[1]
    out = q.new_empty(num_tokens, q.shape[0], q.shape[2])  # [T, Hq, D]
    window = sliding_window if sliding_window else None

    nd = radix.n_decode
    if nd:
        assert radix.decode_slots is not None and radix.decode_lens is not None
        out[:nd] = decode_attention(
            q[:, :nd].transpose(0, 1),
            k_cache,
            v_cache,
            radix.decode_slots,
            radix.decode_lens,
            scaling,
            window,
            paged=radix.paged,
            mask=None if radix.paged else radix.decode_mask(window),
        )

    if radix.extend_slots is not None:
        assert radix.extend_q_starts is not None and radix.extend_q_lens is not None
        out[nd:] = torch.ops.radixchat.paged_extend(
            q[:, nd:].transpose(0, 1).float(),
            k_cache,
            v_cache,
            radix.extend_slots,
            radix.extend_q_starts,
            radix.extend_q_lens,
            radix.extend_kv_lens,
            scaling if scaling is not None else q.shape[-1] ** -0.5,
            window or 0,
        ).to(out.dtype)
        return out.unsqueeze(0), None
    for seq in radix.extends:
        s, e = seq.q_start, seq.q_start + seq.q_len
        qs = q[:, s:e].unsqueeze(0)  # [1, Hq, q_len, D]
        if seq.kv_slots is None:
            ks, vs = key[:, :, s:e], value[:, :, s:e]
            if narrow:
                ks, vs = ks.to(k_cache.dtype).to(q.dtype), vs.to(v_cache.dtype).to(q.dtype)
        else:
            ks = k_cache[seq.kv_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, Hkv, kv_len, D]
            vs = v_cache[seq.kv_slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
        mask = _extend_mask(seq, window, q.device)
        o = F.scaled_dot_product_attention(
            qs,
            ks,
            vs,
            attn_mask=mask,
            is_causal=mask is None and seq.q_len > 1,
            scale=scaling,
            enable_gqa=True,
        )
        out[s:e] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


AttentionInterface.register(ATTN_NAME, radix_attention)
