"""Fixtures for the grammar tests: the default model's tokenizer info (the tokenizer itself and the
converted model dir come from ``tests/conftest.py``) and a small Qwen2-style byte-level BPE trained
here (no network), with a logits width larger than the tokenizer."""

from __future__ import annotations

import json
import random

import pytest

from radixchat.grammar import TokenizerInfo

QWEN2_PRETOKENIZE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<tool_call>", "</tool_call>"]  # added but not special, as in Qwen2.5
QWEN_PADDING = 37  # logits rows past the tokenizer, as Qwen2.5 has (151,936 vs 151,665)


@pytest.fixture(scope="session")
def smol_info(smol_tokenizer) -> TokenizerInfo:
    return TokenizerInfo.from_tokenizer(smol_tokenizer)


def _corpus() -> list[str]:
    rng = random.Random(7)
    words = [
        "the",
        "name",
        "age",
        "city",
        "Paris",
        "London",
        "tokyo",
        "weather",
        "value",
        "items",
        "list",
        "true",
        "false",
        "null",
        "kind",
        "cat",
        "dog",
        "price",
        "total",
        "café",
        "naïve",
        "東京",
        "😀",
        "über",
        "email",
        "user",
        "example",
        "com",
        "id",
        "uuid",
        "date",
        "time",
    ]
    letters = "abcdefghijklmnopqrstuvwxyzéü"
    words += tuple("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(3000))
    out = []
    for _ in range(4000):
        obj = {
            rng.choice(words): rng.choice(
                [
                    rng.randint(-999, 99999),
                    rng.random(),
                    rng.choice(words),
                    None,
                    True,
                    [rng.choice(words), rng.randint(0, 9)],
                    {"a": 1},
                ]
            )
            for _ in range(rng.randint(1, 4))
        }
        out.append(json.dumps(obj, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 2])))
        out.append(" ".join(rng.choice(words) for _ in range(12)) + ".\n")
    return out


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """A byte-level BPE with Qwen2's pre-tokenizer regex, special and added tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=6000,
        special_tokens=QWEN_SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_tokens(QWEN_ADDED)
    return fast


@pytest.fixture(scope="session")
def qwen_info(qwen_tokenizer) -> TokenizerInfo:
    eos = [qwen_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return TokenizerInfo.from_tokenizer(
        qwen_tokenizer, vocab_size=len(qwen_tokenizer) + QWEN_PADDING, eos_ids=eos
    )


@pytest.fixture(params=["smol", "qwen"])
def info(request) -> TokenizerInfo:
    """Both tokenizers, for tests that must hold for each."""
    return request.getfixturevalue(f"{request.param}_info")


@pytest.fixture(scope="session")
def smol_model(smol_dir):
    """The default model (float32, CPU), from the shared converted copy (``tests/conftest.py``)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
