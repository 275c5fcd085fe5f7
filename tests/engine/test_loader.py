"""Model resolution, conversion, and refusing models we cannot run correctly."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, LlamaConfig

from radixchat.engine.loader import (
    BUNDLED_NAME,
    CONVERTED_MARKER,
    check_supported,
    load_model,
    resolve_model,
)
from radixchat.errors import ModelLoadError
from tests.conftest import build_pair, tiny_config


def test_unknown_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        resolve_model(str(tmp_path / "missing-model"), tmp_path)


def test_directory_without_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model(str(tmp_path / "m"), tmp_path)


def test_non_gguf_file(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        resolve_model(str(f), tmp_path)


def test_hub_id_without_network_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot fetch model 'someorg/some-model'"):
        resolve_model("someorg/some-model", tmp_path)


def test_bundled_model_is_converted_once_and_reused(smol_dir):
    from radixchat.config import default_cache_dir

    assert (smol_dir / CONVERTED_MARKER).is_file()
    assert (smol_dir / "model.safetensors").is_file() and (smol_dir / "tokenizer.json").is_file()
    name, again = resolve_model("smollm2", default_cache_dir())
    assert name == BUNDLED_NAME and again == smol_dir


def test_softcapping_models_are_refused():
    with pytest.raises(ModelLoadError, match="softcapping"):
        check_supported(Gemma2Config())


def test_non_attention_layers_are_refused():
    cfg = LlamaConfig()
    cfg.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ModelLoadError, match="layer types"):
        check_supported(cfg)


def test_local_directory_loads_with_radix_attention(tmp_path, smol_tokenizer):
    model, _ = build_pair(tiny_config("qwen2"))
    model.save_pretrained(tmp_path / "tiny")
    smol_tokenizer.save_pretrained(tmp_path / "tiny")
    lm = load_model(str(tmp_path / "tiny"), device="cpu", dtype="float32", cache_dir=tmp_path)
    assert lm.model.config._attn_implementation == "radix"
    assert (lm.vocab_size, lm.num_kv_heads, lm.head_dim, lm.num_layers) == (512, 2, 16, 2)
    assert lm.dtype == torch.float32 and lm.eos_ids == frozenset({smol_tokenizer.eos_token_id})


def test_cuda_request_without_cuda_is_refused(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        load_model("smollm2", device="cuda", cache_dir=tmp_path)
