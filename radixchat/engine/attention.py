"""The attention function that runs unmodified transformers models over our KV pool.

Registered as ``attn_implementation="radix"``. transformers calls it once per layer with the new tokens'
query ``[1, Hq, T, D]`` and key/value ``[1, Hkv, T, D]`` (RoPE applied, GQA not repeated). The batch is
flattened: the first ``n_decode`` tokens are one decode token per sequence, then each extend (prefill
chunk) sequence's tokens in order. We write K/V into the pool at ``out_slots``, gather each sequence's
full K/V from its slots, and attend with a bottom-right-aligned causal mask (a query at offset ``i`` of a
``q_len`` chunk over ``kv_len`` keys sees keys ``0 .. kv_len - q_len + i``). SDPA's ``is_causal`` is
top-left aligned, so it is used only when there is no cached prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from radixchat.engine.kv_pool import KVPool

ATTN_NAME = "radix"


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
    extends: list[ExtendSeq] = field(default_factory=list)
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
    k_cache.index_copy_(0, radix.out_slots, k_new)
    v_cache.index_copy_(0, radix.out_slots, v_new)

    num_tokens = q.shape[1]
    out = q.new_empty(num_tokens, q.shape[0], q.shape[2])  # [T, Hq, D]
    window = sliding_window if sliding_window else None

    nd = radix.n_decode
    if nd:
        assert radix.decode_slots is not None
        idx = radix.decode_slots
        k = k_cache[idx].transpose(1, 2)  # [B, Hkv, Lmax, D]
        v = v_cache[idx].transpose(1, 2)
        qd = q[:, :nd].transpose(0, 1).unsqueeze(2)  # [B, Hq, 1, D]
        o = F.scaled_dot_product_attention(
            qd, k, v, attn_mask=radix.decode_mask(window), scale=scaling, enable_gqa=True
        )
        out[:nd] = o[:, :, 0, :]

    for seq in radix.extends:
        s, e = seq.q_start, seq.q_start + seq.q_len
        qs = q[:, s:e].unsqueeze(0)  # [1, Hq, q_len, D]
        if seq.kv_slots is None:
            ks, vs = key[:, :, s:e], value[:, :, s:e]
        else:
            ks = k_cache[seq.kv_slots].transpose(0, 1).unsqueeze(0)  # [1, Hkv, kv_len, D]
            vs = v_cache[seq.kv_slots].transpose(0, 1).unsqueeze(0)
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
