"""The model fingerprint that keys the KV store: which KV a loaded model would compute.

K/V depend on the weights, the dtype they run in, how the linear layers compute (the weights format),
the device's kernels, and the config's position encoding. The fingerprint hashes all of those. For the
weights it hashes, per tensor, its name, shape and dtype and 192 of its values (the first 64, the last
64, and 64 spread evenly over the rest) from the weights as loaded in memory: cheap, where reading
every byte is not, independent of file names, paths and mtimes (a copied or re-converted
model keeps its fingerprint), and it catches any other checkpoint or fine-tune, which changes the
values of whole tensors. A change to a handful of values in the middle of a tensor would go unnoticed;
no real checkpoint differs that way. Runs on the engine's thread (it reads tensors).
"""

from __future__ import annotations

import hashlib
import json

import torch

from radixchat.engine.kvstore.blocks import BLOCK_TOKENS, FORMAT
from radixchat.engine.loader import LoadedModel

SAMPLES = 64
# Config fields that change K/V (or their layout) without changing any weight tensor.
CONFIG_KEYS = (
    "model_type",
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "rms_norm_eps",
    "layer_norm_eps",
    "hidden_act",
    "attention_bias",
    "max_position_embeddings",
)


def model_fingerprint(lm: LoadedModel) -> str:
    config = lm.model.config.to_dict()
    h = hashlib.blake2b(digest_size=16)
    identity = {
        "format": FORMAT,
        "block_tokens": BLOCK_TOKENS,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "weights_format": lm.weights_format,
        "device": lm.device.type,
        "config": {k: config.get(k) for k in CONFIG_KEYS},
    }
    h.update(json.dumps(identity, sort_keys=True, default=str).encode())
    tensors = dict(lm.model.named_parameters())
    tensors.update(lm.model.named_buffers())
    for name in sorted(tensors):
        t = tensors[name].detach()
        h.update(f"{name}:{list(t.shape)}:{t.dtype}".encode())
        flat = t.reshape(-1)
        n = flat.numel()
        if n == 0:
            continue
        spread = torch.arange(SAMPLES, device=flat.device) * (n - 1) // (SAMPLES - 1)
        sample = torch.cat((flat[:SAMPLES], flat[-SAMPLES:], flat[spread])).cpu().contiguous()
        h.update(sample.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
