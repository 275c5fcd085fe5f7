"""Radix attention against transformers' own sdpa attention, logit by logit."""

from __future__ import annotations

import pytest
import torch

from radixchat.engine.batch import ScheduledBatch
from radixchat.engine.kv_pool import KVPool, KVShape, ReqToTokenTable
from radixchat.engine.model_runner import ModelRunner
from radixchat.engine.request import Request, SamplingParams

ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


class Harness:
    """Drives the model runner by hand: each sequence is a Request whose ids grow as we feed them."""

    def __init__(self, loaded):
        shape = KVShape(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, loaded.dtype)
        self.pool = KVPool(shape, 512, torch.device("cpu"))
        self.table = ReqToTokenTable(8, 256, torch.device("cpu"))
        self.runner = ModelRunner(loaded.model, self.pool, self.table)
        self.reqs: list[Request] = []

    def new_seq(self) -> Request:
        req = Request(len(self.reqs), [], SamplingParams())
        req.row = self.table.alloc()
        self.reqs.append(req)
        return req

    def step(self, feeds: list[tuple[Request, list[int]]]) -> torch.Tensor:
        """Feed tokens (decode feeds = one token, listed first); return last-token logits per feed."""
        starts, num_new, input_ids = [], [], []
        for req, ids in feeds:
            starts.append(req.kv_len)
            num_new.append(len(ids))
            input_ids.extend(ids)
            req.prompt_ids = req.prompt_ids + ids
            self.table.write(req.row, req.kv_len, self.pool.alloc(len(ids)))
            req.kv_len += len(ids)
        n_decode = 0
        while n_decode < len(feeds) and len(feeds[n_decode][1]) == 1 and feeds[n_decode][0].kv_len > 1:
            n_decode += 1
        batch = ScheduledBatch([r for r, _ in feeds], starts, num_new, input_ids, n_decode)
        return self.runner.forward(batch)


def reference_logits(ref, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return ref(torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def rand_ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_prefill_extend_and_batched_decode_match_sdpa(tiny_models, arch):
    loaded, ref = tiny_models[arch]
    h = Harness(loaded)
    a, b, c = h.new_seq(), h.new_seq(), h.new_seq()

    # Packed prefill of three sequences of different lengths (mistral's window is 24: c exceeds it).
    feeds = [(a, rand_ids(5, 1)), (b, rand_ids(9, 2)), (c, rand_ids(30, 3))]
    got = h.step(feeds)
    for i, (req, _) in enumerate(feeds):
        torch.testing.assert_close(got[i], reference_logits(ref, req.prompt_ids), atol=1e-4, rtol=1e-4)

    # Extend on a cached prefix (bottom-right causal mask), mixed with two decodes of unequal length.
    feeds = [(b, rand_ids(1, 4)), (c, rand_ids(1, 5)), (a, rand_ids(7, 6))]
    got = h.step(feeds)
    for i, (req, _) in enumerate(feeds):
        torch.testing.assert_close(got[i], reference_logits(ref, req.prompt_ids), atol=1e-4, rtol=1e-4)

    # Batched decode, all three (padding mask over different lengths).
    for step in range(3):
        feeds = [(r, rand_ids(1, 10 + 3 * step + j)) for j, r in enumerate((a, b, c))]
        got = h.step(feeds)
        for i, (req, _) in enumerate(feeds):
            torch.testing.assert_close(got[i], reference_logits(ref, req.prompt_ids), atol=1e-4, rtol=1e-4)


def test_gqa_is_exercised(tiny_models):
    loaded, _ = tiny_models["llama"]
    assert loaded.num_kv_heads < loaded.model.config.num_attention_heads


def test_qwen3_uses_explicit_head_dim(tiny_models):
    loaded, _ = tiny_models["qwen3"]
    cfg = loaded.model.config
    assert loaded.head_dim == 32 != cfg.hidden_size // cfg.num_attention_heads


def test_attention_without_metadata_fails_loudly(tiny_models):
    loaded, _ = tiny_models["llama"]
    with pytest.raises(RuntimeError, match="without batch metadata"), torch.no_grad():
        loaded.model(torch.tensor([[1, 2, 3]]), use_cache=False)
