"""Tiny random models saved as Hugging Face folders (weights, config, SmolLM2's tokenizer), for switching
between real local backends: only equality matters, so their replies are noise, but exact noise."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from tests.conftest import tiny_config

# Model B renders with another template than SmolLM2's ChatML, so a re-rendering shows which one it used.
OTHER_TEMPLATE = (
    "{% for message in messages %}{{ '### ' + message['role'] + ':\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '### assistant:\\n' }}{% endif %}"
)


def save_tiny_model(path: Path, tokenizer, arch: str, seed: int, template: str | None = None) -> Path:
    """A tiny ``arch`` model with ``tokenizer``'s whole vocabulary, saved (float32) into ``path``."""
    config = tiny_config(arch)
    config.vocab_size = len(tokenizer)
    config.tie_word_embeddings = True
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # random logits are nearly flat: make greedy decisive
        model.get_output_embeddings().weight.mul_(8.0)
    model.save_pretrained(path)
    tok = copy.deepcopy(tokenizer)
    if template is not None:
        tok.chat_template = template
    tok.save_pretrained(path)
    return path


def two_models(root: Path, tokenizer) -> tuple[Path, Path]:
    """``root/tiny-a`` (llama, SmolLM2's template) and ``root/tiny-b`` (qwen2, ``OTHER_TEMPLATE``)."""
    a = save_tiny_model(root / "tiny-a", tokenizer, "llama", 1)
    b = save_tiny_model(root / "tiny-b", tokenizer, "qwen2", 2, OTHER_TEMPLATE)
    return a, b
