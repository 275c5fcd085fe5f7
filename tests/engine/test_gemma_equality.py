"""Gemma 3 270M, the second real model: greedy equals transformers generate() in float32 (short prompts in
one batch, a prompt past its 512-token sliding window, a cache hit), and its end-of-turn token stops."""

from __future__ import annotations

import pytest

from radixchat.chat.conversation import ChatFormat, Conversation
from radixchat.engine.core import EngineConfig, EngineCore
from radixchat.engine.request import SamplingParams
from tests.conftest import hf_greedy

pytestmark = pytest.mark.gemma

QUESTIONS = ["What is the capital of France?", "Write a haiku about autumn.", "List three prime numbers."]


def chat_ids(tokenizer, text: str) -> list[int]:
    conv = Conversation(ChatFormat(tokenizer, model_type="gemma3_text"), system="You answer briefly.")
    return conv.add_user(text)


def test_batched_short_prompts_match_generate(gemma, gemma_tokenizer):
    loaded, ref = gemma
    prompts = [chat_ids(gemma_tokenizer, q) for q in QUESTIONS]
    prompts.append(list(prompts[0]))  # identical to the first: shares everything
    core = EngineCore(loaded, EngineConfig(kv_pool_tokens=2048))
    reqs = [core.make_request(p, SamplingParams(max_tokens=12, ignore_eos=True)) for p in prompts]
    core.run_until_done(reqs)
    core.check_integrity()
    for p, r in zip(prompts, reqs, strict=True):
        assert r.output_ids == hf_greedy(ref, p, 12)
    assert core.scheduler.counters.cached_tokens > 0


def test_past_the_sliding_window_then_a_cache_hit_match_generate(gemma, gemma_tokenizer):
    """A 700-token prompt (the window is 512), prefilled in chunks; then the next turn, which hits it."""
    loaded, ref = gemma
    assert loaded.model.config.sliding_window == 512
    story = " ".join(f"On day {i} the keeper counted {i * 7 % 13} boats in the harbour." for i in range(60))
    first = chat_ids(gemma_tokenizer, f"Read this log, then answer.\n\n{story}\n\nHow many days are there?")
    assert len(first) > 700
    core = EngineCore(loaded, EngineConfig(kv_pool_tokens=4096, chunked_prefill_size=256))
    req = core.make_request(first, SamplingParams(max_tokens=8, ignore_eos=True))
    core.run_until_done([req])
    assert req.output_ids == hf_greedy(ref, first, 8)
    follow = (
        first
        + req.output_ids
        + gemma_tokenizer.encode(
            "<end_of_turn>\n<start_of_turn>user\nAnd boats on day 9?<end_of_turn>\n<start_of_turn>model\n",
            add_special_tokens=False,
        )
    )
    again = core.make_request(follow, SamplingParams(max_tokens=8, ignore_eos=True))
    core.run_until_done([again])
    core.check_integrity()
    assert again.cached_tokens >= len(first) + len(req.output_ids) - 1
    assert again.output_ids == hf_greedy(ref, follow, 8)


def test_end_of_turn_and_eos_both_end_a_reply(gemma):
    loaded, _ = gemma
    tok = loaded.tokenizer
    assert tok.convert_tokens_to_ids("<end_of_turn>") in loaded.eos_ids
    assert tok.eos_token_id in loaded.eos_ids
    assert tok.convert_tokens_to_ids("<start_of_turn>") not in loaded.eos_ids
