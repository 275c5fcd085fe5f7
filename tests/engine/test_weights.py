"""Weights formats: each kernel multiplies like F.linear, the probe's plan is cached per machine, bad formats
are usage errors, and every format this machine can run keeps the real model's predictions (quality guard)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from radixchat.engine import weights as W
from radixchat.errors import ConfigError
from radixchat.machine import cpu_name, probed_auto_choice
from tests.conftest import agreement_bar, build_pair, tiny_config

CPU = torch.device("cpu")
RUNNABLE = [f for f in W.runnable_formats(CPU) if f != "float32"]

# A fixed English text of about 300 tokens (no markup), for teacher-forced agreement.
TEXT = (
    "The lighthouse stood at the end of a narrow spit of rock, and for forty years the same keeper had climbed "
    "its stairs every evening to light the lamp. He knew the sea in all its moods: the flat grey calm of "
    "winter mornings, the sudden squalls that came in from the west in spring, and the long heavy swell that "
    "rolled in after a storm far out in the ocean. Ships passed by at night, their lights moving slowly along "
    "the horizon, and he liked to imagine where they were going and what they carried. One autumn a young "
    "woman arrived from the town with a letter from the harbour master. The lamp was to be replaced by an "
    "automatic light, she explained, and the keeper would no longer be needed. He read the letter twice, "
    "folded it carefully, and put it in the drawer of his desk. Then he made her a cup of tea and showed her "
    "the logbooks, which went back more than a century, recording every storm, every wreck and every ship "
    "that had asked for help. She turned the pages slowly. By the time she left, the sun had set, and the "
    "keeper climbed the stairs one more time to light the lamp. From the window of the bus she watched the "
    "beam sweep across the water, steady and patient, as it had done every night for as long as anyone "
    "could remember. In the town, people said later that the new light was brighter, but the fishermen "
    "still looked for the old one when they came home late."
)


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    """One probe cache for the module's real-model tests (the probe takes seconds)."""
    return tmp_path_factory.mktemp("probe")


def _tables(model: nn.Module) -> list[W.FormatLinear]:
    return [m for m in model.modules() if isinstance(m, W.FormatLinear)]


def test_every_kernel_multiplies_like_f_linear():
    torch.manual_seed(0)
    lin = nn.Linear(128, 64, bias=True)
    x = torch.randn(5, 3, 128)
    want = lin(x)
    for kernel in W.KERNELS:
        if W.kernel_unavailable(kernel, CPU):
            continue
        layer = W.FormatLinear(copy.deepcopy(lin), "layers")
        W._pack(layer, kernel)
        layer.table = ((1 << 62, kernel),)
        got = layer(x)
        assert got.shape == want.shape and got.dtype == want.dtype
        # half precision and 4 bits round the products; they must still be close
        tol = {
            "float32": 1e-6,
            "float16": 2e-2,
            "bfloat16": 5e-2,
            "int4": 0.25,
            "int4-gemv": 0.25,
            "int8": 2e-2,
            "int8-dot8": 3e-2,
        }[kernel]
        assert (got - want).abs().max().item() < tol * want.abs().max().item(), kernel


def test_int8_holds_a_q8_0_tensor_exactly():
    """The bundled GGUF stores its embedding (the tied LM head) in Q8_0: the int8 kernel gets the file's own codes
    and scales back, bit for bit, and its product is that tensor's product up to float32 summation order."""
    from gguf import GGMLQuantizationType, GGUFReader
    from gguf.quants import dequantize

    from radixchat.bundled import SMOLLM2

    gguf = SMOLLM2.gguf(Path("/nonexistent"))  # a single-file package: its file, nothing joined
    tensor = next(t for t in GGUFReader(str(gguf)).tensors if t.name == "token_embd.weight")
    assert tensor.tensor_type == GGMLQuantizationType.Q8_0
    rows = 4096  # of 49152: enough to see every code, quick to check
    blocks = np.asarray(tensor.data)[:rows]  # [rows, blocks * 34]: a float16 scale, then 32 int8 codes
    k = blocks.shape[1] // 34 * 32
    raw = blocks.reshape(rows, -1, 34)
    want_scale = raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    want_codes = raw[..., 2:].copy().view(np.int8).reshape(rows, k)
    weight = torch.from_numpy(dequantize(blocks, tensor.tensor_type).astype(np.float32))
    codes, scales = W._pack_int8(weight)
    assert torch.equal(codes.transpose(1, 2).reshape(rows, k), torch.from_numpy(want_codes))
    assert torch.equal(scales.transpose(1, 2).reshape(rows, -1).float(), torch.from_numpy(want_scale))
    assert W.kernel_unavailable("int8", CPU) is None
    layer = W.FormatLinear(nn.Linear(k, rows, bias=False), "head")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    W._pack(layer, "int8")
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(0))
    got, want = W._MM["int8"](layer, x).double(), x.double() @ weight.double().T
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    full = W._MM["int8"](layer, x)
    assert all(torch.equal(W._MM["int8"](layer, x[i : i + 1]), full[i : i + 1]) for i in range(3))


@pytest.mark.parametrize("k", [96, 2048])
def test_int8_dot8_holds_a_4_bit_grid_and_is_the_exact_product_of_8_bit_activations(k):
    """The int8 format's layers: 256 levels per group of 32 from its minimum, so a Q4_1 group (16 levels, codes
    spanning 0..15) lands on every 17th code and keeps its values; the product is the float64 product of those
    weights with the activations rounded as the kernel rounds them (per row and 16 inputs: scale max|x| / 127,
    codes round(x / scale)); and a row's result is the same bits however many rows come with it."""
    if W.kernel_unavailable("int8-dot8", CPU):
        pytest.skip("no native int8 kernel on this machine")
    g = torch.Generator().manual_seed(k)
    n = 192
    q = torch.randint(0, 16, (n, k // 32, 32), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15  # as a Q4_1 quantizer makes them: the group's minimum and maximum are codes
    d = torch.rand(n, k // 32, 1, generator=g) * 0.01 + 1e-3
    m = torch.randn(n, k // 32, 1, generator=g) * 0.05
    weight = (q * d + m).reshape(n, k)
    codes, sz = W._pack_u8(weight)
    assert codes.shape == (n // 64, k // 4, 64, 4) and sz.shape == (n // 64, k // 32, 2, 64)
    assert bool((codes.int() % 17 == 0).all())
    per_input = codes.permute(0, 2, 1, 3).reshape(n, k).double()  # [N, K]
    scale, low = (sz[:, :, i].permute(0, 2, 1).reshape(n, k // 32).double() for i in (0, 1))
    back = (per_input.view(n, -1, 32) * scale[..., None] + low[..., None]).view(n, k)
    assert (back - weight.double()).abs().max() <= 1e-6 * weight.abs().max()
    x = torch.randn(9, k, generator=g)
    x[2, :16] = 0  # an all-zero half group
    groups = x.view(9, -1, 16)
    amax = groups.abs().amax(-1, keepdim=True)
    xq = torch.round(groups * torch.where(amax > 0, 127 / amax, 0)).clamp(-127, 127)
    want = (xq * (amax / 127)).view(9, k).double() @ back.T
    full = torch.ops.radixchat.int8_dot8(x, codes, sz)
    assert full.dtype == torch.float32 and full.shape == (9, n)
    assert (full.double() - want).abs().max() <= 1e-5 * want.abs().max() * (k / 64) ** 0.5
    for lo, hi in ((0, 1), (3, 4), (8, 9), (0, 3), (1, 6), (2, 9)):
        assert torch.equal(torch.ops.radixchat.int8_dot8(x[lo:hi], codes, sz), full[lo:hi]), (lo, hi)


def test_int4_reproduces_q4_1_weights_up_to_bfloat16_rounding():
    """A weight already on a Q4_1 grid (the bundled GGUF's linears) keeps its 4-bit codes: reading it back
    through the kernel differs only by bfloat16 rounding (of the group scales and of the output)."""
    torch.manual_seed(1)
    n, k = 16, 64
    q = torch.randint(0, 16, (n, k // 32, 32)).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1 maps each block's minimum to 0 and its maximum to 15
    scale = torch.rand(n, k // 32, 1).to(torch.bfloat16).float() / 10  # scales bfloat16 can hold
    lo = torch.randn(n, k // 32, 1).to(torch.bfloat16).float() / 10
    w = (q * scale + lo).reshape(n, k)
    lin = nn.Linear(k, n, bias=False)
    lin.weight.data = w
    if W.kernel_unavailable("int4", CPU):
        pytest.skip("no int4 kernel on this machine")
    layer = W.FormatLinear(lin, "layers")
    W._pack(layer, "int4")
    layer.table = ((1 << 62, "int4"),)
    eye = torch.eye(k)
    # x = identity rows read the weights back; bfloat16 activations are exact for 0/1, outputs round
    back = layer(eye).t()
    assert torch.allclose(back, w, rtol=2**-7, atol=2**-8 * w.abs().max().item())
    requantized = torch.randint(0, 16, (n, k)).float()  # a weight off the grid does not come back this close
    assert not torch.allclose(back, w + requantized * 1e-2, rtol=2**-7, atol=2**-8 * w.abs().max().item())


def test_auto_takes_int4_only_for_weights_already_on_its_grid(tmp_path, monkeypatch):
    """int4 is the fastest here, but a model whose layers are not on a 4-bit grid (random weights; Gemma 3's
    5-bit layers) does not get it from auto: that would requantize them. Snapped to a Q4_1 grid, it does."""
    timings = {
        "layers": {"1": {"float32": 9.0, "bfloat16": 5.0, "float16": 4.0, "int4": 1.0}},
        "head": {"1": {"float32": 2.0, "float16": 1.0}},
    }
    monkeypatch.setattr(W, "load_or_probe", lambda *a, **k: timings)
    model, _ = build_pair(tiny_config("llama"))
    head = model.get_output_embeddings()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and m is not head]
    assert not W.on_int4_grid(linears)
    assert W.apply_weights(model, "auto", CPU, tmp_path).format == "float16"
    assert W.apply_weights(copy.deepcopy(model), "int4", CPU, tmp_path).format == "int4"  # asked for: given
    snapped, _ = build_pair(tiny_config("llama"))
    with torch.no_grad():
        for m in snapped.modules():
            if isinstance(m, nn.Linear) and m is not snapped.get_output_embeddings():
                g = m.weight.view(m.out_features, -1, 32)
                q = torch.randint(0, 16, g.shape, generator=torch.Generator().manual_seed(0)).float()
                q[..., 0], q[..., 1] = 0, 15  # every block spans its range, as Q4_1's do
                g.copy_(q * g.abs().amax(-1, keepdim=True) / 15 - g.abs().amax(-1, keepdim=True) / 2)
    assert W.apply_weights(snapped, "auto", CPU, tmp_path).format == "int4"


def test_plan_picks_the_fastest_kernel_per_bucket_within_the_format():
    timings = {
        "layers": {
            "1": {"float32": 9.0, "bfloat16": 5.0, "float16": 2.0, "int4": 1.0},
            "8": {"float32": 9.0, "bfloat16": 4.0, "float16": 8.0, "int4": 3.0},
            "64": {"float32": 9.0, "bfloat16": 6.0, "float16": 20.0, "int4": 7.0},
            "512": {"float32": 50.0, "bfloat16": 60.0, "float16": 99.0, "int4": 70.0},
        },
        "head": {"1": {"float32": 2.5, "bfloat16": 4.0, "float16": 2.0, "int4": 1.0}},
    }
    plan = W.plan_from_probe("int4", timings, CPU)
    assert plan.tables["layers"] == ((8, "int4"), (64, "bfloat16"), (1 << 62, "float32"))
    assert plan.tables["head"] == ((1 << 62, "float32"),)  # with int4 layers the logits stay exact
    assert W.plan_from_probe("float16", timings, CPU).tables["head"] == ((1 << 62, "float16"),)  # never bf16
    assert W.plan_from_probe("float16", timings, CPU).tables["layers"] == (
        (1, "float16"),
        (64, "bfloat16"),  # prefill chunks take bfloat16 where it is the faster product
        (1 << 62, "float32"),
    )
    assert W.plan_from_probe("float32", timings, CPU).tables["layers"] == ((1 << 62, "float32"),)
    runnable = W.runnable_formats(CPU)
    auto = W.plan_from_probe("auto", timings, CPU)
    assert auto.format == (
        "int4" if "int4" in runnable else "float16" if "float16" in runnable else "float32"
    )


def test_a_near_tie_with_float32_goes_to_the_exact_kernel():
    timings = {
        "layers": {"1": {"float32": 9.0, "bfloat16": 8.5, "float16": 8.2, "int4": 2.0}},
        "head": {"1": {"float32": 5.29, "float16": 4.85}, "2": {"float32": 9.0, "float16": 4.0}},
    }
    assert W.plan_from_probe("float16", timings, CPU).tables["layers"] == ((1 << 62, "float32"),)  # 9% faster
    plan = W.plan_from_probe("float16", timings, CPU)
    assert plan.tables["head"] == ((1, "float32"), (1 << 62, "float16"))  # 8% faster at 1 row, 2x at 2


def test_unknown_format_is_a_usage_error_naming_the_choices():
    with pytest.raises(ConfigError, match=r"unknown weights format 'int3' \(choose one of: auto, float32"):
        W.check_weights_format("int3", CPU)


def test_a_format_the_machine_cannot_run_is_a_usage_error():
    # No CUDA device can run the CPU kernels; the message names what can run.
    with pytest.raises(
        ConfigError, match=r"'int4' cannot run on this machine .*choose one of: auto, float32"
    ):
        W.check_weights_format("int4", torch.device("cuda"))


def test_the_probe_runs_once_per_machine_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(W, "cpu_load", lambda: 0.1)  # a quiet machine (see the busy-machine test)
    model, _ = build_pair(tiny_config("llama"))
    plan = W.apply_weights(model, "auto", CPU, tmp_path)
    cache = json.loads((tmp_path / "weights-probe.json").read_text())
    (key,) = cache
    assert cpu_name() in key and torch.__version__.split("+")[0] in key
    (result,) = cache[key].values()
    assert set(result["timings"]) == {"layers", "head"} and result["auto"] == plan.format
    # A second model of the same shapes reuses the cached timings: the file is not rewritten.
    mtime = (tmp_path / "weights-probe.json").stat().st_mtime_ns
    again, _ = build_pair(tiny_config("llama"))
    assert W.apply_weights(again, "auto", CPU, tmp_path) == plan
    assert (tmp_path / "weights-probe.json").stat().st_mtime_ns == mtime
    assert probed_auto_choice(tmp_path) == plan.format


@pytest.mark.parametrize(
    ("then", "now", "probed_again"), [(2.0, 0.1, True), (2.0, 1.5, False), (0.1, 0.1, False)]
)
def test_a_probe_taken_on_a_busy_machine_is_taken_again_once_it_is_quiet(
    tmp_path, monkeypatch, then, now, probed_again
):
    model, _ = build_pair(tiny_config("llama"))
    monkeypatch.setattr(W, "cpu_load", lambda: then)
    W.apply_weights(model, "auto", CPU, tmp_path)
    path = tmp_path / "weights-probe.json"
    ((result,),) = (v.values() for v in json.loads(path.read_text()).values())
    assert result["load"] == then
    mtime = path.stat().st_mtime_ns
    monkeypatch.setattr(W, "cpu_load", lambda: now)
    again, _ = build_pair(tiny_config("llama"))
    W.apply_weights(again, "auto", CPU, tmp_path)
    assert (path.stat().st_mtime_ns != mtime) is probed_again
    ((result,),) = (v.values() for v in json.loads(path.read_text()).values())
    assert result["load"] == (now if probed_again else then)
    if probed_again:  # a deterministic start holds even a busy probe: its plan decides its reply's bits
        monkeypatch.setattr(W, "cpu_load", lambda: then)
        W.apply_weights(build_pair(tiny_config("llama"))[0], "auto", CPU, tmp_path / "held")
        monkeypatch.setattr(W, "cpu_load", lambda: now)
        mtime = (tmp_path / "held" / "weights-probe.json").stat().st_mtime_ns
        W.apply_weights(
            build_pair(tiny_config("llama"))[0], "auto", CPU, tmp_path / "held", deterministic=True
        )
        assert (tmp_path / "held" / "weights-probe.json").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("fmt", RUNNABLE)
def test_every_format_serves_requests_like_generate_on_the_same_format(fmt, tmp_path, smol_tokenizer):
    """With a compact format, the engine (prefill chunks, then decode steps: several table rows) gives the
    tokens transformers generate gives on the same swapped weights, the tied embedding stays one tensor, and
    the logits stay close to float32's."""
    from radixchat.engine.core import EngineConfig, EngineCore
    from radixchat.engine.loader import describe_model
    from radixchat.engine.request import SamplingParams
    from tests.conftest import hf_greedy

    cfg = tiny_config("llama")
    cfg.tie_word_embeddings = True
    model, ref = build_pair(cfg)
    exact = copy.deepcopy(ref)
    for m in (model, ref):
        assert W.apply_weights(m, fmt, CPU, tmp_path).format == fmt
        assert m.get_output_embeddings().weight is m.get_input_embeddings().weight
    assert _tables(model) and all(layer.table for layer in _tables(model))
    prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    core = EngineCore(
        describe_model(model, smol_tokenizer, "tiny", tmp_path),
        EngineConfig(kv_pool_tokens=512, chunked_prefill_size=16),
    )
    req = core.make_request(prompt, SamplingParams(max_tokens=8, ignore_eos=True))
    core.run_until_done([req])
    assert req.output_ids == hf_greedy(ref, prompt, 8)
    with torch.inference_mode():
        x = torch.tensor([prompt + req.output_ids])
        want, got = exact(x, use_cache=False).logits.float(), ref(x, use_cache=False).logits.float()
    tol = {"float16": 2e-2, "bfloat16": 5e-2, "int8": 5e-2, "int4": 0.25}[fmt]
    assert (got - want).abs().max().item() < tol * want.abs().max().item()


@pytest.mark.real_model
@pytest.mark.parametrize("fmt", RUNNABLE)
def test_quality_guard_teacher_forced_agreement_with_float32(fmt, smol, smol_tokenizer, probe_dir):
    """Teacher-forced on a fixed ~300-token text, every kernel a format uses (the decode one and the prefill
    ones) agrees with float32 on the top-1 token at >= 98% of positions (97% with 8-bit activations,
    ``agreement_bar``), and its mean NLL is within 2%."""
    _guard(smol[1], smol_tokenizer.encode(TEXT), fmt, probe_dir)


@pytest.mark.gemma
def test_quality_guard_gemma_int8(gemma, gemma_tokenizer, probe_dir):
    """Gemma 3's layers are Q4_K, Q5_0 and Q6_K in its GGUF: ``auto`` may requantize them to int8 (never to int4,
    ``test_auto_takes_int4_only_for_weights_already_on_its_grid``), and int8 keeps its predictions too."""
    if W.kernel_unavailable("int8", CPU):
        pytest.skip("no int8 kernel on this machine")
    _guard(gemma[1], gemma_tokenizer.encode(TEXT), "int8", probe_dir)


def _guard(ref: nn.Module, ids: list[int], fmt: str, probe_dir) -> None:  # noqa: ANN001
    assert 250 <= len(ids) <= 400
    x = torch.tensor([ids])
    with torch.inference_mode():
        base = ref(x, use_cache=False).logits[0, :-1].float()
    target = x[0, 1:]
    base_nll = torch.nn.functional.cross_entropy(base, target).item()
    model = copy.deepcopy(ref)
    plan = W.apply_weights(model, fmt, CPU, probe_dir)
    assert plan.format == fmt
    groups = W._groups(model)
    # Every kernel of every group's table, with the other groups on their decode (one-row) kernel.
    for group, table in plan.tables.items():
        for kernel in sorted({k for _, k in table}):
            used = []
            for g, items in groups.items():
                use = kernel if g == group else plan.tables[g][0][1]
                used.append(use)
                for _, _, layer in items:
                    W._pack(layer, use)
                    layer.table = ((1 << 62, use),)
            with torch.inference_mode():
                logits = model(x, use_cache=False).logits[0, :-1].float()
            agree = (logits.argmax(-1) == base.argmax(-1)).float().mean().item()
            nll = torch.nn.functional.cross_entropy(logits, target).item()
            print(f"{fmt} {group}/{kernel}: top-1 agreement {agree:.3f}, NLL {nll:.4f} vs {base_nll:.4f}")
            assert agree >= min(map(agreement_bar, used)), (group, kernel, agree)
            assert abs(nll - base_nll) <= 0.02 * base_nll, (group, kernel, nll, base_nll)
