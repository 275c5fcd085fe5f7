"""The async API: streaming, cancellation, stats, errors, sampling, and grammar masks."""

from __future__ import annotations

import asyncio

import pytest
import torch

from radixchat.engine import Engine, EngineConfig, FinishEvent, FinishReason, SamplingParams, TokenEvent
from radixchat.engine.detokenizer import Detokenizer
from radixchat.errors import EngineStoppedError, PromptTooLongError, RequestError


def chat_ids(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


@pytest.fixture
async def tiny_engine(tiny_models):
    engine = Engine(tiny_models["llama"][0], EngineConfig(kv_pool_tokens=512, debug=True))
    await engine.start()
    yield engine
    await engine.stop()
    engine.core.check_integrity()


@pytest.fixture
async def smol_engine(smol):
    engine = Engine(smol[0], EngineConfig(kv_pool_tokens=4096, debug=True))
    await engine.start()
    yield engine
    await engine.stop()
    engine.core.check_integrity()


async def test_stream_yields_tokens_then_one_finish(tiny_engine):
    handle = tiny_engine.submit(list(range(1, 20)), SamplingParams(max_tokens=6, ignore_eos=True))
    events = [ev async for ev in handle]
    assert [type(e) for e in events] == [TokenEvent] * 6 + [FinishEvent]
    fin = events[-1]
    assert fin.reason is FinishReason.LENGTH
    assert fin.usage.prompt_tokens == 19 and fin.usage.completion_tokens == 6
    assert fin.ttft_s is not None and fin.ttft_s > 0


@pytest.mark.real_model
async def test_streamed_text_equals_full_decode(smol_engine, smol_tokenizer):
    comp = await smol_engine.generate(
        chat_ids(smol_tokenizer, "Write two sentences about Zürich, with an emoji."),
        SamplingParams(max_tokens=48),
    )
    ids = comp.token_ids[:-1] if comp.token_ids[-1] in smol_engine.eos_ids else comp.token_ids
    assert comp.text == smol_tokenizer.decode(ids, skip_special_tokens=False)
    assert "\ufffd" not in comp.text


def test_detokenizer_never_emits_a_replacement_for_split_characters(smol_tokenizer):
    text = "héllo 日本語 wörld 🎉 ok"
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    detok = Detokenizer(smol_tokenizer.backend_tokenizer)
    pieces = [detok.push(t)[0] for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + detok.flush() == text
    assert "" in pieces  # some tokens end mid-character and produce nothing yet


async def test_special_tokens_mid_reply_are_text_but_the_final_eos_is_not(tiny_engine, smol_tokenizer):
    # Token 0 (<|endoftext|>) is special but not an EOS of this tiny model; it must show as text.
    comp = await tiny_engine.generate(
        [5, 6, 7], SamplingParams(max_tokens=3), FixedSequence([0, 28], 512, eos=0)
    )
    assert comp.token_ids[:2] == [0, 28] and comp.text.startswith("<|endoftext|>")


def test_detokenizer_holds_back_a_possible_stop_string(smol_tokenizer):
    ids = smol_tokenizer.encode("one two three END four", add_special_tokens=False)
    detok = Detokenizer(smol_tokenizer.backend_tokenizer, stop=(" END",))
    shown, hit = "", False
    for t in ids:
        piece, hit = detok.push(t)
        shown += piece
        if hit:
            break
    assert hit and shown + detok.flush() == "one two three"


@pytest.mark.real_model
async def test_stop_string_ends_the_reply_and_is_not_shown(smol_engine, smol_tokenizer):
    ids = chat_ids(smol_tokenizer, "Count from 1 to 10, separated by commas.")
    full = await smol_engine.generate(ids, SamplingParams(max_tokens=40))
    assert "5" in full.text
    cut = await smol_engine.generate(ids, SamplingParams(max_tokens=40, stop=("5",)))
    assert cut.finish_reason is FinishReason.STOP
    assert cut.text == full.text[: full.text.index("5")]


async def test_cancel_stops_and_releases_slots(tiny_engine):
    prompt = list(range(3, 40))
    handle = tiny_engine.submit(prompt, SamplingParams(max_tokens=400, ignore_eos=True))
    out: list[int] = []
    async for ev in handle:
        if isinstance(ev, TokenEvent):
            out.append(ev.token_id)
            if len(out) == 3:
                handle.cancel()
        else:
            fin = ev
    assert fin.reason is FinishReason.CANCELLED
    assert 3 <= fin.usage.completion_tokens < 400
    stats = tiny_engine.stats()
    assert stats.running == 0 and stats.tree_protected == 0
    assert stats.pool_used == stats.tree_tokens  # no private slots left behind
    # What it generated is cached: the same prompt now hits prompt + output - 1 tokens.
    assert len(out) == fin.usage.completion_tokens
    assert tiny_engine.core.cache.prefix_len(prompt + out) == len(prompt) + len(out) - 1


async def test_cancel_of_waiting_request(tiny_engine):
    handle = tiny_engine.submit(list(range(5, 30)), SamplingParams(max_tokens=5))
    handle.cancel()
    comp = await handle.result()
    assert comp.finish_reason in (FinishReason.CANCELLED, FinishReason.LENGTH, FinishReason.STOP)


async def test_bad_requests_raise_clear_errors_and_engine_keeps_serving(tiny_engine):
    with pytest.raises(PromptTooLongError, match="KV pool of 512 tokens"):
        tiny_engine.submit(list(range(1, 500)) * 2, SamplingParams())
    with pytest.raises(RequestError, match="empty prompt"):
        tiny_engine.submit([], SamplingParams())
    with pytest.raises(RequestError, match="outside the vocabulary"):
        tiny_engine.submit([1, 2, 10**6], SamplingParams())
    with pytest.raises(RequestError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(RequestError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(RequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(RequestError, match=r"seed must be an integer in \[0, 2\*\*63 - 1\]"):
        SamplingParams(seed=2**64)
    with pytest.raises(RequestError, match="repetition_penalty must be in"):
        SamplingParams(repetition_penalty=1e-300)
    comp = await tiny_engine.generate([1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(comp.token_ids) == 4


async def test_prompt_longer_than_model_context_is_refused(tiny_models):
    engine = Engine(tiny_models["llama"][0], EngineConfig(kv_pool_tokens=4096))
    await engine.start()
    try:
        with pytest.raises(PromptTooLongError, match="model's context of 2048"):
            engine.submit([1] * 2048, SamplingParams())
    finally:
        await engine.stop()


async def test_generation_stops_at_the_pool_limit_when_alone(tiny_models):
    engine = Engine(tiny_models["llama"][0], EngineConfig(kv_pool_tokens=40))
    async with engine:
        comp = await engine.generate(list(range(1, 30)), SamplingParams(max_tokens=100, ignore_eos=True))
    assert comp.finish_reason is FinishReason.LENGTH
    assert 29 + len(comp.token_ids) <= 41
    engine.core.check_integrity()


async def test_submit_before_start_raises(tiny_models):
    engine = Engine(tiny_models["llama"][0], EngineConfig(kv_pool_tokens=64))
    with pytest.raises(EngineStoppedError):
        engine.submit([1, 2], SamplingParams())
    await engine.stop()
    with pytest.raises(EngineStoppedError, match="stopped"):
        await engine.start()
    with pytest.raises(EngineStoppedError):
        engine.call(lambda: 1)


async def test_work_handed_to_the_engine_runs_on_its_thread(tiny_engine):
    import threading

    assert tiny_engine.call(threading.current_thread).name == "radixchat-engine"
    with pytest.raises(ZeroDivisionError):
        tiny_engine.call(lambda: 1 / 0)
    comp = await tiny_engine.generate([1, 2, 3], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(comp.token_ids) == 3


async def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_engine):
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=42, ignore_eos=True)
    alone = await tiny_engine.generate([7, 8, 9], params)
    together = await asyncio.gather(
        tiny_engine.generate([7, 8, 9], params),
        tiny_engine.generate(
            [1, 2, 3, 4], SamplingParams(max_tokens=12, temperature=1.0, seed=1, ignore_eos=True)
        ),
    )
    assert together[0].token_ids == alone.token_ids
    other = await tiny_engine.generate(
        [7, 8, 9], SamplingParams(max_tokens=12, temperature=1.0, seed=43, ignore_eos=True)
    )
    assert other.token_ids != alone.token_ids


async def test_vanishing_temperature_and_top_p_sample_like_greedy(tiny_engine):
    """1e-300 overflowed the logits (temperature) or rounded to 0 in float32 (top_p): no token was left."""
    greedy = await tiny_engine.generate([4, 5, 6], SamplingParams(max_tokens=8, ignore_eos=True))
    for params in ({"temperature": 1e-300}, {"temperature": 1.0, "top_p": 1e-300}):
        comp = await tiny_engine.generate(
            [4, 5, 6], SamplingParams(max_tokens=8, seed=5, ignore_eos=True, **params)
        )
        assert comp.error is None and comp.token_ids == greedy.token_ids, params


async def test_top_k_one_is_greedy(tiny_engine):
    greedy = await tiny_engine.generate([4, 5, 6], SamplingParams(max_tokens=8, ignore_eos=True))
    topk = await tiny_engine.generate(
        [4, 5, 6], SamplingParams(max_tokens=8, temperature=1.5, top_k=1, seed=3, ignore_eos=True)
    )
    assert topk.token_ids == greedy.token_ids


async def test_repetition_penalty_changes_greedy_output(tiny_engine):
    plain = await tiny_engine.generate([4, 5, 6], SamplingParams(max_tokens=30, ignore_eos=True))
    assert len(set(plain.token_ids)) < 30  # a random tiny model repeats itself
    penalized = await tiny_engine.generate(
        [4, 5, 6], SamplingParams(max_tokens=30, repetition_penalty=5.0, ignore_eos=True)
    )
    assert len(set(penalized.token_ids)) > len(set(plain.token_ids))


class FixedSequence:
    """A real TokenMatcher: only the tokens of one sequence, then only EOS."""

    budget_limited = False  # never narrows for a budget

    def __init__(self, seq: list[int], vocab: int, eos: int) -> None:
        self.seq, self.vocab, self.eos, self.pos = seq, vocab, eos, 0

    def allowed(self, remaining=None):
        mask = torch.zeros(self.vocab, dtype=torch.bool)
        mask[self.seq[self.pos] if self.pos < len(self.seq) else self.eos] = True
        return mask

    def advance(self, token_id):
        expect = self.seq[self.pos] if self.pos < len(self.seq) else self.eos
        if token_id != expect:
            raise ValueError(f"token {token_id} not allowed")
        self.pos += 1

    def is_accepting(self):
        return self.pos >= len(self.seq)

    def is_terminated(self):
        return self.pos > len(self.seq)


async def test_grammar_mask_constrains_sampling(tiny_engine):
    matcher = FixedSequence([10, 20, 30], 512, eos=0)
    comp = await tiny_engine.generate(
        [1, 2, 3], SamplingParams(max_tokens=10, temperature=1.0, seed=0), matcher
    )
    assert comp.token_ids == [10, 20, 30, 0]
    assert comp.finish_reason is FinishReason.STOP


class BrokenMatcher(FixedSequence):
    def advance(self, token_id):
        raise ValueError("broken grammar")


async def test_a_failing_grammar_fails_only_its_request(tiny_engine):
    bad = tiny_engine.submit([1, 2, 3], SamplingParams(max_tokens=5), BrokenMatcher([10], 512, 0))
    good = tiny_engine.submit([1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
    bad_c, good_c = await asyncio.gather(bad.result(), good.result())
    assert bad_c.finish_reason is FinishReason.ERROR and "broken grammar" in bad_c.error
    assert good_c.finish_reason is FinishReason.LENGTH


class MaskRaises(FixedSequence):
    def allowed(self, remaining=None):
        raise RuntimeError("mask bug")


async def test_a_grammar_whose_mask_raises_fails_only_its_request(tiny_engine):
    bad = tiny_engine.submit([1, 2, 3], SamplingParams(max_tokens=5), MaskRaises([10], 512, 0))
    good = tiny_engine.submit([4, 5, 6], SamplingParams(max_tokens=5, ignore_eos=True))
    bad_c, good_c = await asyncio.gather(bad.result(), good.result())
    assert bad_c.finish_reason is FinishReason.ERROR and "mask bug" in bad_c.error
    assert good_c.finish_reason is FinishReason.LENGTH and len(good_c.token_ids) == 5


async def test_stats_report_hits_pool_tree_and_memory(tiny_engine):
    prompt = list(range(10, 60))
    first = await tiny_engine.generate(prompt, SamplingParams(max_tokens=5, ignore_eos=True))
    second = prompt + first.token_ids + [1, 2]
    await tiny_engine.generate(second, SamplingParams(max_tokens=5, ignore_eos=True))
    st = tiny_engine.stats()
    assert st.prompt_tokens == 50 + 57
    assert st.cached_tokens == 50 + 5 - 1  # the first prompt + its output minus the last token
    assert st.hit_rate == pytest.approx(54 / 107)
    assert st.pool_capacity == 512 and st.pool_used == st.tree_tokens > 0
    assert st.process_rss > 0 and st.device_allocated is None
    assert st.tree and all(n.num_tokens > 0 for n in st.tree)
    assert st.last_request is not None and st.last_request.cached_tokens == 54
    path = tiny_engine.cached_path(second)
    assert path and set(path) <= {n.id for n in st.tree}


async def test_many_concurrent_streams_all_finish(tiny_engine):
    handles = [
        tiny_engine.submit([i, i + 1, i + 2], SamplingParams(max_tokens=8, ignore_eos=True))
        for i in range(1, 40)
    ]
    results = await asyncio.gather(*(h.result() for h in handles))
    assert all(len(r.token_ids) == 8 for r in results)
