"""The paged decode kernel reads the pool in place and gives what gathering the keys and running SDPA gives,
in every pool dtype, head layout and window; and a row's result never depends on the rest of the batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixchat.engine.attention import PAGED_HEAD_DIMS, decode_attention
from radixchat.engine.kernels import load_paged_attention

if why := load_paged_attention():
    pytest.skip(f"the paged attention kernel cannot be built here: {why}", allow_module_level=True)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _pool(slots: int, hkv: int, d: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, hkv, d, generator=g).to(dtype)
    v = torch.randn(slots, hkv, d, generator=g).to(dtype)
    k[0].zero_()
    v[0].zero_()
    return k, v


def _reference(q, k, v, slots, lens, window):
    """Per sequence: gather its visible keys (in float32) and run SDPA."""
    out = []
    for b in range(q.shape[0]):
        n = int(lens[b])
        lo = max(0, n - window) if window else 0
        idx = slots[b, lo:n]
        kb = k[idx].float().transpose(0, 1)[None]  # [1, Hkv, n, D]
        vb = v[idx].float().transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(q[b : b + 1, :, None].float(), kb, vb, enable_gqa=True)
        out.append(o[0, :, 0])
    return torch.stack(out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("hq", "hkv", "d"), [(9, 3, 64), (4, 2, 16), (8, 8, 32), (32, 8, 128), (4, 1, 256)])
def test_paged_decode_matches_gather_and_sdpa(dtype, hq, hkv, d):
    assert d in PAGED_HEAD_DIMS
    k, v = _pool(3000, hkv, d, dtype)
    g = torch.Generator().manual_seed(1)
    lens = torch.tensor([1, 17, 256, 257, 1500])  # one key, a partial chunk, chunk edges, many chunks
    slots = torch.randint(1, 3000, (len(lens), 1600), generator=g)  # scattered, as a busy pool's are
    q = torch.randn(len(lens), hq, d, generator=g)
    got = decode_attention(q, k, v, slots, lens, None, None, paged=True)
    want = _reference(q, k, v, slots, lens, None)
    assert got.dtype == torch.float32 and got.shape == (len(lens), hq, d)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("window", [1, 24, 256, 300])
def test_paged_decode_honours_the_sliding_window(window):
    k, v = _pool(2000, 2, 64, torch.float32)
    lens = torch.tensor([5, 24, 25, 700, 1024])
    slots = torch.arange(1, 1 + 1024)[None].repeat(len(lens), 1)
    q = torch.randn(len(lens), 4, 64, generator=torch.Generator().manual_seed(2))
    got = decode_attention(q, k, v, slots, lens, None, window, paged=True)
    torch.testing.assert_close(got, _reference(q, k, v, slots, lens, window), rtol=2e-5, atol=2e-5)


def test_paged_decode_agrees_with_the_gathering_path_and_its_mask():
    """The engine's two decode paths give the same attention (the gathering one pads to the longest row)."""
    from radixchat.engine.attention import AttentionBatch
    from radixchat.engine.kv_pool import KVPool, KVShape

    pool = KVPool(KVShape(1, 2, 32, torch.float32), 600, torch.device("cpu"))
    pool.k[0].copy_(torch.randn(601, 2, 32))
    pool.v[0].copy_(torch.randn(601, 2, 32))
    lens = torch.tensor([3, 300, 41])
    slots = torch.randint(1, 601, (3, 300))
    slots[0, 3:] = 0
    slots[2, 41:] = 0
    meta = AttentionBatch(pool, torch.zeros(3, dtype=torch.long), 3, slots, lens, decode_uniform=False)
    q = torch.randn(3, 6, 32)
    for window in (None, 20):
        paged = decode_attention(q, pool.k[0], pool.v[0], slots, lens, None, window, paged=True)
        mask = meta.decode_mask(window)
        gathered = decode_attention(
            q, pool.k[0], pool.v[0], slots, lens, None, window, paged=False, mask=mask
        )
        torch.testing.assert_close(paged, gathered, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_rows_result_does_not_depend_on_its_batch(dtype):
    """Batch invariance: each row, bit for bit, whatever else is in the batch, its place in it, the slot
    table's width, and how many threads run."""
    k, v = _pool(5000, 3, 64, dtype)
    g = torch.Generator().manual_seed(3)
    lens = torch.tensor([4000, 1, 300, 2049, 77, 512])
    slots = torch.randint(1, 5000, (len(lens), 4096), generator=g)
    q = torch.randn(len(lens), 9, 64, generator=g)
    batched = decode_attention(q, k, v, slots, lens, None, None, paged=True)
    threads = torch.get_num_threads()
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            for b in range(len(lens)):
                alone = decode_attention(
                    q[b : b + 1],
                    k,
                    v,
                    slots[b : b + 1, : lens[b]].clone(),
                    lens[b : b + 1],
                    None,
                    None,
                    paged=True,
                )
                assert torch.equal(alone[0], batched[b]), (n, b)
            perm = torch.tensor([5, 3, 1, 0, 4, 2])
            shuffled = decode_attention(q[perm], k, v, slots[perm], lens[perm], None, None, paged=True)
            assert torch.equal(shuffled, batched[perm])
    finally:
        torch.set_num_threads(threads)


def test_the_kernel_refuses_what_it_cannot_do():
    k, v = _pool(10, 1, 64, torch.float32)
    q = torch.randn(1, 2, 64)
    with pytest.raises(RuntimeError, match="length"):
        torch.ops.radixchat.paged_decode(
            q, k, v, torch.ones(1, 4, dtype=torch.long), torch.tensor([5]), 1.0, 0
        )
    with pytest.raises(RuntimeError, match="head_dim"):
        k2, v2 = _pool(10, 1, 48, torch.float32)
        torch.ops.radixchat.paged_decode(
            torch.randn(1, 2, 48), k2, v2, torch.ones(1, 4, dtype=torch.long), torch.tensor([2]), 1.0, 0
        )


def _extend_reference(q, k, v, slots, q_starts, q_lens, kv_lens, window):
    """Per sequence: its queries over its visible keys (bottom-right causal, and the window), SDPA in float32
    over the bfloat16-rounded operands the kernel multiplies."""
    out = []
    for n in range(len(q_lens)):
        t0, tq, tk = int(q_starts[n]), int(q_lens[n]), int(kv_lens[n])
        qs = q[t0 : t0 + tq].bfloat16().float().transpose(0, 1)[None]
        idx = slots[n, :tk]
        kn = k[idx].bfloat16().float().transpose(0, 1)[None]
        vn = v[idx].bfloat16().float().transpose(0, 1)[None]
        qp = torch.arange(tq)[:, None] + tk - tq
        kp = torch.arange(tk)[None]
        mask = kp <= qp
        if window:
            mask &= kp > qp - window
        out.append(
            F.scaled_dot_product_attention(qs, kn, vn, attn_mask=mask, enable_gqa=True)[0].transpose(0, 1)
        )
    return torch.cat(out)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("hq", "hkv", "d"), [(9, 3, 64), (4, 2, 16), (32, 8, 128), (4, 1, 256), (6, 2, 256), (6, 6, 32)]
)
@pytest.mark.parametrize("window", [0, 50])
def test_paged_extend_matches_sdpa_within_bfloat16_rounding(dtype, hq, hkv, d, window):
    """Prefill chunks over their prefix and themselves, several sequences in one call: what SDPA gives on the
    same (bfloat16-rounded) operands, within the rounding of the weights to bfloat16 (~0.4% of a value)."""
    k, v = _pool(3000, hkv, d, dtype)
    g = torch.Generator().manual_seed(4)
    q_lens = torch.tensor([1, 17, 300, 40, 33])
    kv_lens = torch.tensor([1, 600, 300, 1000, 290])  # no prefix, a prefix, chunk edges, partial pairs
    q_starts = torch.cumsum(q_lens, 0) - q_lens
    slots = torch.randint(1, 3000, (len(q_lens), 1000), generator=g)
    q = torch.randn(int(q_lens.sum()), hq, d, generator=g)
    got = torch.ops.radixchat.paged_extend(q, k, v, slots, q_starts, q_lens, kv_lens, d**-0.5, window)
    want = _extend_reference(q, k, v, slots, q_starts, q_lens, kv_lens, window)
    assert got.shape == want.shape
    assert (got - want).norm() / want.norm() < 5e-3
    torch.testing.assert_close(got, want, rtol=0, atol=3e-2)


# (query heads, KV heads, head_dim): 64 dimensions take one pass of P·V, 256 four slices, here with three query
# heads per KV head (fewer rows than a pass holds)
HEADS = [(9, 3, 64), (6, 2, 256)]


@pytest.mark.parametrize(("hq", "hkv", "d"), HEADS)
def test_a_prefill_rows_result_does_not_depend_on_its_batch(hq, hkv, d):
    """A query's result, bit for bit, whether its sequence runs alone or beside others, whatever the thread
    count: each row's sums run in one order."""
    k, v = _pool(3000, hkv, d, torch.float16)
    g = torch.Generator().manual_seed(5)
    q_lens, kv_lens = torch.tensor([40, 300, 7]), torch.tensor([900, 300, 2000])
    q_starts = torch.cumsum(q_lens, 0) - q_lens
    slots = torch.randint(1, 3000, (3, 2000), generator=g)
    q = torch.randn(int(q_lens.sum()), hq, d, generator=g)
    scale = d**-0.5
    both = torch.ops.radixchat.paged_extend(q, k, v, slots, q_starts, q_lens, kv_lens, scale, 0)
    threads = torch.get_num_threads()
    try:
        for n in (1, threads):
            torch.set_num_threads(n)
            for i in range(3):
                s, e = int(q_starts[i]), int(q_starts[i] + q_lens[i])
                alone = torch.ops.radixchat.paged_extend(
                    q[s:e],
                    k,
                    v,
                    slots[i : i + 1],
                    torch.tensor([0]),
                    q_lens[i : i + 1],
                    kv_lens[i : i + 1],
                    scale,
                    0,
                )
                assert torch.equal(alone, both[s:e]), (n, i)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("hq", "hkv", "d"), HEADS)
@pytest.mark.parametrize("window", [0, 300])
def test_a_decode_row_through_the_extend_kernel_equals_the_same_query_in_a_prefill(window, hq, hkv, d):
    """The arithmetic deterministic inference relies on: a query decoded alone (split-K over its chunks,
    merged after) gives the bits it gets inside a prefill chunk (its chunks one after the other)."""
    k, v = _pool(3000, hkv, d, torch.float16)
    g = torch.Generator().manual_seed(6)
    slots = torch.randint(1, 3000, (1, 1000), generator=g)
    q = torch.randn(300, hq, d, generator=g)
    scale = d**-0.5
    chunk = torch.ops.radixchat.paged_extend(
        q, k, v, slots, torch.tensor([0]), torch.tensor([300]), torch.tensor([1000]), scale, window
    )
    for t in (0, 150, 299):  # each sees 701 + t keys: three or four 256-key chunks
        alone = torch.ops.radixchat.paged_extend(
            q[t : t + 1],
            k,
            v,
            slots,
            torch.tensor([0]),
            torch.tensor([1]),
            torch.tensor([701 + t]),
            scale,
            window,
        )
        assert torch.equal(alone[0], chunk[t]), t
