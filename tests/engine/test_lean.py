"""The lean forward (``engine/lean.py``) gives the transformers model's logits bit for bit: every step of a
batched run (mixed prefill chunks and decodes, sliding windows outgrown, a cache hit), on each architecture it
knows, with the pool in the model's dtype (gathered prefill attention) and in bfloat16 (the native prefill
kernel), and for a bfloat16 model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config

from radixchat.engine import EngineConfig, SamplingParams
from radixchat.engine.core import EngineCore
from radixchat.engine.lean import ARCHS, lean_forward
from radixchat.engine.loader import describe_model
from tests.conftest import build_pair, tiny_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _steps(core: EngineCore, prompts: list[list[int]]) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Every step's logits, and the replies."""
    seen: list[torch.Tensor] = []
    forward = core.runner.forward

    def record(batch):
        logits = forward(batch)
        seen.append(logits.clone())
        return logits

    core.runner.forward = record
    reqs = [core.make_request(p, GREEDY) for p in prompts]
    core.run_until_done(reqs)
    again = core.make_request(prompts[0][:30] + [7, 8, 9], GREEDY)  # a cache hit that splits a node
    core.run_until_done([again])
    core.check_integrity()
    return seen, [r.output_ids for r in [*reqs, again]]


@pytest.mark.parametrize(
    ("dtype", "kv_dtype"),
    [(torch.float32, None), (torch.float32, "bfloat16"), (torch.bfloat16, None)],  # a GPU's model dtype too
)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma3"])
def test_the_lean_forward_gives_the_models_logits_bit_for_bit(arch, dtype, kv_dtype, tmp_path):
    model, _ = build_pair(tiny_config(arch), dtype=dtype)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (45, 9, 70)]  # past the windows
    runs = {}
    for lean in (True, False):
        lm = describe_model(model, None, f"tiny-{arch}", tmp_path)
        cfg = EngineConfig(kv_dtype=kv_dtype, chunked_prefill_size=16, cache_dir=tmp_path)
        core = EngineCore(lm, cfg)
        assert core.runner.lean is not None
        if not lean:
            core.runner.lean = None
        runs[lean] = _steps(core, prompts)
    (lean_logits, lean_out), (ref_logits, ref_out) = runs[True], runs[False]
    assert lean_out == ref_out
    assert len(lean_logits) == len(ref_logits) > 20
    for a, b in zip(lean_logits, ref_logits):
        assert torch.equal(a, b)


def test_an_architecture_it_does_not_know_runs_through_transformers():
    config = Gemma2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16,
    )  # fmt: skip
    assert config.model_type not in ARCHS
    assert lean_forward(AutoModelForCausalLM.from_config(config)) is None


def _counting_native(core: EngineCore) -> dict[str, int]:
    """Counts the pure-decode steps the native decode step ran (``lean.decode`` returned logits) and declined."""
    lean = core.runner.lean
    decode = lean.decode
    count = {"native": 0, "declined": 0}

    def counted(*args):
        logits = decode(*args)
        count["native" if logits is not None else "declined"] += 1
        return logits

    lean.decode = counted
    return count


@pytest.mark.parametrize(
    ("layers", "head", "kv_dtype", "deterministic"),
    [
        ("int8-dot8", "int8", "float16", False),
        ("int4-gemv", "float16", "bfloat16", False),
        ("int4-dot8", "int8", None, False),
        ("float16", "float16", "float16", False),
        ("bfloat16", "float32", None, False),
        ("int8-dot8", "int8", "float16", True),  # decode tokens attend as one-token extends
        ("float32x8", "float32x8", None, True),
    ],
)
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma3"])
def test_the_native_decode_step_gives_the_lean_forwards_logits_bit_for_bit(
    arch, layers, head, kv_dtype, deterministic, tmp_path
):
    """Every decode step in native code (``kernels/decode_step.cpp``) against the lean forward in Python, with
    the weights in each kernel it runs (a layer too narrow for a native kernel keeps float32), three streams of
    different lengths, sliding windows outgrown and a cache hit; in deterministic inference too, where a
    decoded token's attention is the prefill kernel's."""
    from radixchat.engine.kernels import decode_step_ready
    from radixchat.engine.weights import WeightsPlan, install_plan

    model, _ = build_pair(tiny_config(arch))
    with torch.no_grad():  # norms as trained ones are, not all ones (or zeros: Gemma's 1 + w)
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.2)
    install_plan(model, WeightsPlan(layers, {"layers": ((1 << 62, layers),), "head": ((1 << 62, head),)}))
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (45, 9, 70)]
    runs = {}
    for native in (True, False):
        lm = describe_model(model, None, f"tiny-{arch}", tmp_path)
        cfg = EngineConfig(
            kv_dtype=kv_dtype, chunked_prefill_size=16, cache_dir=tmp_path, deterministic=deterministic
        )
        core = EngineCore(lm, cfg)
        if not decode_step_ready():
            pytest.skip("the native kernels could not be built here")
        core.runner.native_decode = native
        count = _counting_native(core)
        runs[native] = _steps(core, prompts)
        assert count["declined"] == 0 and (count["native"] > 10) == native
    (native_logits, native_out), (lean_logits, lean_out) = runs[True], runs[False]
    assert native_out == lean_out
    assert len(native_logits) == len(lean_logits)
    for a, b in zip(native_logits, lean_logits):
        assert torch.equal(a, b)


def test_the_native_decode_step_declines_what_it_does_not_compute(tmp_path):
    """A kernel it does not run (torch's int4 matmul) or a pool read by gathering: the lean forward runs."""
    from radixchat.engine.weights import WeightsPlan, install_plan

    model, _ = build_pair(tiny_config("llama"))
    install_plan(model, WeightsPlan("int4", {"layers": ((1 << 62, "int4"),)}))
    lm = describe_model(model, None, "tiny-llama", tmp_path)
    core = EngineCore(lm, EngineConfig(cache_dir=tmp_path))
    count = _counting_native(core)
    req = core.make_request(list(range(5, 30)), GREEDY)
    core.run_until_done([req])
    assert count["native"] == 0 and count["declined"] > 0 and len(req.output_ids) == GREEDY.max_tokens
