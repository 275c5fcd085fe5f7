"""Packed models (issue 35): a GGUF converted tensor by tensor into int4 codes on disk, memory-mapped, with no
float32 copy — the file's own codes, the engine's equality on it, the quality guard on both real models, and
the loader's choices and errors."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import agreement_bar, hf_greedy

from bench.model_1b import Shape, write
from radixchat.engine import packed
from radixchat.engine import weights as W
from radixchat.engine.core import EngineConfig, EngineCore
from radixchat.engine.loader import load_model
from radixchat.engine.request import SamplingParams
from radixchat.errors import ModelLoadError

TINY = Shape(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny Llama GGUF in Q4_0 with the bundled tokenizer (logits sharpened: greedy is decisive)."""
    return write(tmp_path_factory.mktemp("gguf") / "tiny-q4_0.gguf", "Q4_0", shape=TINY, head_scale=40.0)


@pytest.fixture(scope="module")
def tiny_packed(tiny_gguf, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return load_model(str(tiny_gguf), weights="packed", cache_dir=cache), cache


def _random_blocks(kind, rows: int, cols: int) -> np.ndarray:
    """Random blocks of a 4-bit GGUF type whose float16 fields are finite (any bytes are valid codes)."""
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    halves = 2 if kind.name in ("Q4_1", "Q4_K") else 1
    raw[:, : 2 * halves] = rng.uniform(0.001, 0.1, (len(raw), halves)).astype(np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_codes_and_group_scales_are_read_from_the_blocks_exactly(kind):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    t = GGMLQuantizationType[kind]
    rows, cols = 64, 512
    blocks = _random_blocks(t, rows, cols)
    tensor = type("T", (), {"tensor_type": t, "shape": np.array([cols, rows]), "data": blocks})()
    codes, scale, low = packed._int4_codes(tensor)
    assert codes.shape == (rows, cols) and codes.max() <= 15
    rebuilt = codes.reshape(rows, -1, 32) * scale[..., None] + low[..., None]
    np.testing.assert_allclose(rebuilt.reshape(rows, cols), dequantize(blocks, t), rtol=1e-6, atol=1e-6)
    # ... and the int4 kernel multiplies with them (its scales rounded to bfloat16)
    w_int4, sz = packed._pack_codes(codes, scale, low)
    layer = _packed_layer(w_int4, sz)
    x = torch.randn(3, cols)
    want = x @ torch.from_numpy(dequantize(blocks, t)).T
    assert W.kernel_unavailable("int4-gemv", CPU) is None  # the native library is built and loaded
    for kernel in ("int4", "int4-gemv", "int4-dot8"):
        got = W._MM[kernel](layer, x)
        assert (got - want).abs().max() <= 0.02 * want.abs().max(), kernel
    # A symmetric format's groups (Q4_0: every offset 0) keep their scales alone, which the native kernels read to
    # the same bits (from 64 rows on int4_dot8 unpacks, so 70 rows take that path); torch's int4 matmul cannot.
    alone = packed._scale_only(sz)
    assert alone.shape == ((sz.shape[0], rows, 1) if kind == "Q4_0" else sz.shape)
    if kind != "Q4_0":
        return
    assert not W.kernel_fits("int4", _packed_layer(w_int4, alone))
    for rows_x in (1, 3, 70):
        x = torch.randn(rows_x, cols)
        for op in ("int4_gemv", "int4_dot8"):
            got = getattr(torch.ops.radixchat, op)(x, w_int4, alone)
            assert torch.equal(got, getattr(torch.ops.radixchat, op)(x, w_int4, sz)), (op, rows_x)
    out = [torch.empty(cols, rows, dtype=torch.bfloat16) for _ in range(2)]
    torch.ops.radixchat.int4_dequant(w_int4, sz, out[0])
    torch.ops.radixchat.int4_dequant(w_int4, alone, out[1])
    assert torch.equal(out[0], out[1])


def _packed_layer(w_int4: torch.Tensor, sz: torch.Tensor) -> W.FormatLinear:
    layer = W.FormatLinear(
        torch.nn.Linear(w_int4.shape[1] * 2, sz.shape[1], bias=False, device="meta"), "layers"
    )
    layer.register_buffer("w_int4", w_int4)
    layer.register_buffer("sz_int4", sz)
    return layer


@pytest.mark.parametrize("k", [64, 2048])
def test_int4_gemv_is_the_exact_product_of_the_codes_and_each_row_is_batch_invariant(k):
    """The native decode product against float64 arithmetic on the same codes, scales and bfloat16-rounded
    activations; and a row's result is the same bits however many rows come with it, wherever it sits."""
    assert W.kernel_unavailable("int4-gemv", CPU) is None  # built and checked against torch's int4 layout
    n = 192
    gen = torch.Generator().manual_seed(k)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    scale = torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3
    low = -8 * scale + torch.randn(n, k // 32, generator=gen) * 1e-3
    w_int4, sz = packed._pack_codes(codes.numpy().astype(np.uint8), scale.numpy(), low.numpy())
    layer = W.FormatLinear(torch.nn.Linear(k, n, bias=False, device="meta"), "layers")
    layer.register_buffer("w_int4", w_int4)
    layer.register_buffer("sz_int4", sz)
    s, off = sz.double().unbind(-1)  # [groups, n]: the kernel's (q - 8) * scale + offset
    w = (codes.double().view(n, -1, 32) - 8) * s.T[..., None] + off.T[..., None]
    x = torch.randn(9, k, generator=gen)
    want = x.to(torch.bfloat16).double() @ w.view(n, k).T
    full = torch.ops.radixchat.int4_gemv(x, w_int4, sz)
    assert full.dtype == torch.float32 and full.shape == (9, n)
    assert (full.double() - want).abs().max() <= 1e-5 * want.abs().max() * (k / 64) ** 0.5
    for lo, hi in ((0, 1), (3, 4), (8, 9), (0, 3), (1, 6), (2, 9)):
        assert torch.equal(torch.ops.radixchat.int4_gemv(x[lo:hi], w_int4, sz), full[lo:hi]), (lo, hi)


@pytest.mark.parametrize("k", [64, 2048])
def test_int4_dot8_is_the_exact_product_of_the_codes_and_8_bit_activations(k):
    """The integer product against float64 arithmetic on the same codes and scales and on the activations rounded
    as the kernel rounds them (per row and 16 inputs: scale max|x| / 127, codes round(x / scale)); and a row's
    result is the same bits however many rows come with it, wherever it sits (from 64 rows on, the kernel first
    unpacks the codes: the same sums in the same order)."""
    assert W.kernel_unavailable("int4-dot8", CPU) is None
    n = 192
    gen = torch.Generator().manual_seed(k + 1)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int32)
    scale = torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3
    low = -8 * scale + torch.randn(n, k // 32, generator=gen) * 1e-3
    w_int4, sz = packed._pack_codes(codes.numpy().astype(np.uint8), scale.numpy(), low.numpy())
    s, off = sz.double().unbind(-1)
    w = (codes.double().view(n, -1, 32) - 8) * s.T[..., None] + off.T[..., None]
    x = torch.randn(70, k, generator=gen)
    x[2, :16] = 0  # an all-zero half group
    groups = x.view(70, -1, 16)
    amax = groups.abs().amax(-1, keepdim=True)
    q = torch.round(groups * torch.where(amax > 0, 127 / amax, 0)).clamp(-127, 127)
    assert q.abs().max() == 127 and torch.equal(q[2, 0], torch.zeros(16))
    want = (q * (amax / 127)).view(70, k).double() @ w.view(n, k).T
    full = torch.ops.radixchat.int4_dot8(x, w_int4, sz)
    assert full.dtype == torch.float32 and full.shape == (70, n)
    assert (full.double() - want).abs().max() <= 1e-5 * want.abs().max() * (k / 64) ** 0.5
    rounded_bf16 = x.to(torch.bfloat16).double() @ w.view(n, k).T  # what int4-gemv computes: close to it
    assert (full.double() - rounded_bf16).abs().max() <= 0.02 * rounded_bf16.abs().max()
    for lo, hi in ((0, 1), (3, 4), (69, 70), (0, 3), (1, 6), (2, 9), (0, 64), (5, 69)):
        assert torch.equal(torch.ops.radixchat.int4_dot8(x[lo:hi], w_int4, sz), full[lo:hi]), (lo, hi)


def test_a_packed_model_has_no_float32_weights(tiny_packed):
    lm, cache = tiny_packed
    assert lm.weights.format == "packed" and packed.is_packed(lm.path)
    linears = [lin for items in W._groups(lm.model).values() for _, _, lin in items]
    assert linears and all(lin.weight is None for lin in linears)
    assert all(hasattr(lin, "w_int4") for lin in linears)  # every layer and the head: the file's 4-bit codes
    head = lm.model.get_output_embeddings()
    assert not hasattr(head, "w_float16") and {k for _, k in head.table} <= {
        "int4",
        "int4-gemv",
    }  # products of its int4 codes
    assert lm.model.get_input_embeddings().weight.dtype == torch.float16  # the lookup's rows
    big = [
        name
        for name, t in (*lm.model.named_parameters(), *lm.model.named_buffers())
        if t.dtype == torch.float32 and t.numel() > TINY.hidden
    ]
    assert big == [], big  # no float32 copy of any matrix
    assert lm.vocab_size == head.out_features and lm.dtype == torch.float32


def test_packing_happens_once_and_a_stale_layout_is_packed_again(tiny_gguf, tiny_packed, monkeypatch):
    lm, cache = tiny_packed
    marker = lm.path / packed.PACKED_MARKER
    before = marker.stat().st_mtime_ns
    again = load_model(str(tiny_gguf), weights="packed", cache_dir=cache)
    assert again.path == lm.path and marker.stat().st_mtime_ns == before
    monkeypatch.setattr(packed, "layout_fingerprint", lambda: "another-cpu")
    assert packed.convert(tiny_gguf, cache, "tiny-q4_0") == lm.path
    assert marker.stat().st_mtime_ns != before  # packed again for this (pretend) CPU's int4 layout


def test_packed_model_stays_close_to_the_float32_model_of_the_same_file(tiny_gguf, tiny_packed, tmp_path):
    lm, _ = tiny_packed
    exact = _sdpa(load_model(str(tiny_gguf), weights="float32", cache_dir=tmp_path).path)
    model = packed.load(lm.path, attn="sdpa")
    # a Q4_0 file: every layer keeps its scales alone (its offsets are 0), for the native kernels only
    layers = [m for m in model.modules() if isinstance(m, W.FormatLinear) and hasattr(m, "sz_int4")]
    assert layers and all(m.sz_int4.shape[-1] == 1 and not W.kernel_fits("int4", m) for m in layers)
    ids = torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = exact(ids, use_cache=False).logits.float()
        for kernel in ("int4-gemv", "int4-dot8", "int4-bf16"):
            W.install_plan(model, _one_kernel(kernel))
            got = model(ids, use_cache=False).logits.float()
            assert (got - want).abs().max() <= 0.05 * want.abs().max(), kernel
            assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9, kernel


def _sdpa(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()


def _one_kernel(kernel: str) -> W.WeightsPlan:
    return W.WeightsPlan("packed", {"layers": ((1 << 62, kernel),), "head": ((1 << 62, "float16"),)})


@pytest.mark.parametrize("kernel", ["int4-gemv", "int4-dot8", "int4-bf16"])
def test_engine_greedy_equals_transformers_on_the_packed_model(tiny_packed, kernel):
    """Equality on the packed weights: chunked prefill, two streams batched, then a cache hit, against plain
    transformers generate over the same packed weights (one kernel for every row count on both)."""
    lm, _ = tiny_packed
    plan = _one_kernel(kernel)
    ref = packed.load(lm.path, attn="sdpa")
    for m in (lm.model, ref):
        W.install_plan(m, plan)
    core = EngineCore(copy.copy(lm), EngineConfig(kv_pool_tokens=1024, chunked_prefill_size=16))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (37, 52)]
    reqs = [core.make_request(p, SamplingParams(max_tokens=8, ignore_eos=True)) for p in prompts]
    core.run_until_done(reqs)
    for p, req in zip(prompts, reqs, strict=True):
        assert req.output_ids == hf_greedy(ref, p, 8)
    follow = prompts[0] + reqs[0].output_ids + [17, 99, 1203]
    again = core.make_request(follow, SamplingParams(max_tokens=8, ignore_eos=True))
    core.run_until_done([again])
    assert again.cached_tokens >= len(prompts[0])
    assert again.output_ids == hf_greedy(ref, follow, 8)
    W.install_plan(lm.model, lm.weights)


@pytest.mark.parametrize("kernel", ["int4-gemv", "int4-dot8"])
def test_compiled_decode_step_runs_the_packed_model(tiny_packed, tmp_path, monkeypatch, kernel):
    """The AOTInductor decode step over a packed model (int4 codes, no float32 weights) gives the same greedy
    tokens as transformers generate over the same weights, and holds no copy of them."""
    from safetensors import safe_open

    from radixchat.engine import decode_graph as G
    from radixchat.engine.attention import paged_decode_usable

    lm, _ = tiny_packed
    if why := G.compile_unavailable(lm.model, CPU, paged=False):
        pytest.skip(why)
    plan = _one_kernel(kernel)  # the decode kernels the probe plans: a native op inside the graph
    ref = packed.load(lm.path, attn="sdpa")
    for m in (lm.model, ref):
        W.install_plan(m, plan)
    served = copy.copy(lm)
    served.weights = plan
    paged = paged_decode_usable(lm.head_dim, CPU)
    spec = G.build_spec(served, torch.float32, paged, 1)
    out = tmp_path / "compiled" / spec.key
    G.compile_graphs(lm.model, spec.ranges, out, paged=paged)
    with safe_open(str(out / "decode-1-1.constants.safetensors"), framework="pt") as f:
        assert not any(k.endswith(("w_int4", "w_float16")) for k in f.keys())  # noqa: SIM118
    monkeypatch.setattr(G.DecodeGraphs, "_start_builder", lambda *a, **k: pytest.fail("no builder may start"))
    core = EngineCore(
        served, EngineConfig(kv_pool_tokens=512, max_running_requests=1, compile="on", cache_dir=tmp_path)
    )
    assert core.decode_compiled == "ready"
    prompt = torch.randint(0, 49152, (21,), generator=torch.Generator().manual_seed(5)).tolist()
    req = core.make_request(prompt, SamplingParams(max_tokens=10, ignore_eos=True))
    core.run_until_done([req])
    assert req.output_ids == hf_greedy(ref, prompt, 10)
    W.install_plan(lm.model, lm.weights)


@pytest.mark.parametrize("kind", ["Q4_1", "Q5_0", "Q8_0", "F16", "BF16"])
def test_each_gguf_type_is_packed_at_its_own_precision(kind, tmp_path):
    """4-bit tensors keep their codes (int4); tensors of more bits become float16, exact for F16 and close for
    the rest: the packed model's logits match the float32 model's of the same file."""
    gguf = write(tmp_path / f"tiny-{kind.lower()}.gguf", kind, shape=TINY)
    lm = load_model(str(gguf), weights="packed", cache_dir=tmp_path)
    layers = [lin for _, _, lin in W._groups(lm.model)["layers"]]
    four_bit = kind == "Q4_1"
    assert all(hasattr(lin, "w_int4") == four_bit and hasattr(lin, "w_float16") != four_bit for lin in layers)
    if not four_bit:
        assert {k for lin in layers for _, k in lin.table} == {"float16"}
    exact = _sdpa(load_model(str(gguf), weights="float32", cache_dir=tmp_path / "exact").path)
    model = packed.load(lm.path, attn="sdpa")
    W.install_plan(model, lm.weights)
    ids = torch.randint(0, 49152, (1, 24), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want, got = (m(ids, use_cache=False).logits.float() for m in (exact, model))
    tol = 0.05 if four_bit else 2e-3  # int4: bfloat16 activations and scales; float16: its rounding
    assert (got - want).abs().max() <= tol * want.abs().max()


def test_auto_packs_a_gguf_whose_float32_copy_would_crowd_memory(tiny_gguf, tmp_path, monkeypatch):
    lm = load_model(str(tiny_gguf), weights="auto", cache_dir=tmp_path)
    assert lm.weights.format != "packed"  # a few MB of float32: the float32 path and its kernels
    monkeypatch.setattr(packed, "available_memory", lambda: 8 << 20)
    assert packed.use_packed(tiny_gguf)
    monkeypatch.setattr(packed, "available_memory", lambda: 64 << 30)
    assert not packed.use_packed(tiny_gguf)


def test_a_model_too_big_to_pack_is_one_line_before_loading(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setattr(packed, "available_memory", lambda: 1 << 20)
    with pytest.raises(ModelLoadError) as err:
        load_model(str(tiny_gguf), weights="packed", cache_dir=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "tiny-q4_0 needs about" in msg and "GiB available" in msg
    assert not list(tmp_path.glob("models/*"))  # refused before anything was written


def test_packed_needs_a_gguf_and_a_damaged_one_is_one_line(tmp_path, smol_dir):
    with pytest.raises(ModelLoadError, match="needs a .gguf model"):
        load_model(str(smol_dir), weights="packed", cache_dir=tmp_path)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError) as err:
        load_model(str(bad), weights="packed", cache_dir=tmp_path)
    assert "\n" not in str(err.value) and "broken.gguf" in str(err.value)


TEXT_TOKENS = 300


def _agreement(
    name: str, ref: torch.nn.Module, tokenizer, cache: Path
) -> list[tuple[str, float, float, float]]:
    from test_weights import TEXT

    ids = tokenizer.encode(TEXT)
    x = torch.tensor([ids])
    target = x[0, 1:]
    with torch.inference_mode():
        base = ref(x, use_cache=False).logits[0, :-1].float()
    base_nll = torch.nn.functional.cross_entropy(base, target).item()
    lm = load_model(name, weights="packed", cache_dir=cache)
    model = packed.load(lm.path, attn="sdpa")
    # Both real models store their (tied) embedding in 8 bits: the head multiplies its float16 rows.
    assert model.get_output_embeddings().w_float16 is model.get_input_embeddings().weight
    out = []
    for kernel in ("int4", "int4-gemv", "int4-dot8", "int4-bf16"):
        W.install_plan(model, _one_kernel(kernel))
        with torch.inference_mode():
            logits = model(x, use_cache=False).logits[0, :-1].float()
        agree = (logits.argmax(-1) == base.argmax(-1)).float().mean().item()
        nll = torch.nn.functional.cross_entropy(logits, target).item()
        print(f"{name} packed layers/{kernel}: top-1 agreement {agree:.4f}, NLL {nll:.4f} vs {base_nll:.4f}")
        out.append((kernel, agree, nll, base_nll))
    return out


def _guard(results) -> None:  # noqa: ANN001
    for kernel, agree, nll, base_nll in results:
        assert agree >= agreement_bar(kernel), (kernel, agree)
        assert abs(nll - base_nll) <= 0.02 * base_nll, (kernel, nll, base_nll)


@pytest.mark.real_model
def test_quality_guard_packed_smollm2(smol, smol_tokenizer, tmp_path):
    """The bundled model packed (Q4_1 codes, float16 head) keeps >= 98% teacher-forced top-1 agreement with
    float32 (int4-dot8: 96.5%, ``agreement_bar``) and its NLL within 2%, with every layer kernel."""
    _guard(_agreement("smollm2", smol[1], smol_tokenizer, tmp_path))


@pytest.mark.gemma
def test_quality_guard_packed_gemma(gemma, gemma_tokenizer, tmp_path):
    """Gemma 3 270M packed (its Q4_K tensors as codes, its Q5_0/Q6_K/Q8_0 ones as float16, its 262k-row head
    in float16) passes the same guard."""
    _guard(_agreement("gemma3-270m", gemma[1], gemma_tokenizer, tmp_path))


def test_a_packed_models_builder_waits_for_memory(tiny_packed, monkeypatch):
    from radixchat.engine import decode_graph as G

    lm, _ = tiny_packed
    monkeypatch.setattr(G, "available_memory", lambda: 64 << 30)
    assert G.builder_memory_problem(lm.path) is None
    monkeypatch.setattr(G, "available_memory", lambda: 256 << 20)
    assert "its builder needs about" in G.builder_memory_problem(lm.path)


def test_the_parameter_count_reads_only_the_tensor_table(tiny_gguf, tmp_path):
    """Every GGUF start asks whether to pack: the count skips the metadata gguf-py parses (4 s for a 49k vocabulary)."""
    from gguf import GGUFReader

    from radixchat.bundled import SMOLLM2
    from radixchat.config import default_cache_dir
    from radixchat.engine.model_size import gguf_parameter_count, parameter_count

    for path in (tiny_gguf, SMOLLM2.gguf(default_cache_dir())):
        assert gguf_parameter_count(path) == sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOPE" + b"\0" * 40)
    assert parameter_count(junk) is None
