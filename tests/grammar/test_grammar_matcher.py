"""The matcher's contract: masks equal brute force, EOS and special tokens, widths, budgets, whitespace."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from grammar_helpers import brute_mask, first_rejection, walk

from radixchat.grammar import GrammarError, RunCache, TokenizerInfo, compile_grammar, compile_json_schema

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "ü"]}, "maxItems": 3},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["name"],
}


def _struct_tokens(info: TokenizerInfo) -> list[int]:
    """Tokens made of JSON punctuation/digits: biases walks into deep nesting and many boundaries."""
    return [i for i, b in enumerate(info.token_bytes) if b and all(c in b'[]{},:" 0123456789-.' for c in b)]


@pytest.mark.parametrize("which", ["json", "schema"])
def test_allowed_equals_brute_force_with_caches_cold_and_warm(info, which):
    rng = random.Random(1)
    g = compile_grammar("json", info) if which == "json" else compile_json_schema(PERSON, info, cache=False)
    bias = _struct_tokens(info)
    checked = 0
    for rnd in range(2):  # round 0 fills the caches, round 1 reads them
        rng.seed(3)
        for _ in range(3):
            m = g.matcher()
            for step in range(40):
                mask = m.allowed().numpy()
                if step % 6 == rnd:
                    assert np.array_equal(mask, brute_mask(m, info)), f"step {step}"
                    checked += 1
                allowed = np.flatnonzero(mask)
                pref = [t for t in bias if mask[t]]
                tid = int(rng.choice(pref) if pref and rng.random() < 0.8 else rng.choice(allowed.tolist()))
                if tid in info.eos_ids:
                    break
                m.advance(tid)
    assert checked >= 10


def test_eos_only_in_accepting_states_and_every_eos_id(qwen_info):
    g = compile_grammar("json", qwen_info)
    assert len(qwen_info.eos_ids) == 2
    m = g.matcher()
    for piece in [b"{", b'"a"', b":", b"1", b"}"]:
        mask = m.allowed()
        assert bool(mask[list(qwen_info.eos_ids)].any()) == m.is_accepting()
        m.advance_bytes(piece)
    mask = m.allowed()
    assert m.is_accepting() and m.is_terminated()
    assert all(mask[e] for e in qwen_info.eos_ids)
    assert int(mask.sum()) == len(qwen_info.eos_ids)


def test_special_tokens_never_allowed_unless_named(info):
    g = compile_grammar("json", info)
    rng = random.Random(0)
    for _ in range(5):
        m = g.matcher()
        for _ in range(30):
            mask = m.allowed()
            specials = [i for i in info.special_text if i not in info.eos_ids]
            assert not mask[specials].any()
            tid = int(rng.choice(np.flatnonzero(mask.numpy()).tolist()))
            if tid in info.eos_ids:
                break
            m.advance(tid)
    start = next(i for i, s in info.special_text.items() if s == "<|im_start|>")
    named = compile_grammar('start: "<|im_start|>" "x"', info)
    m = named.matcher()
    assert m.allowed()[start]
    m.advance(start)
    m.advance_bytes(b"x")
    assert m.is_accepting()


def test_mask_width_is_the_logits_width_and_padding_is_never_allowed(qwen_info):
    g = compile_json_schema(None, qwen_info)
    m = g.matcher()
    mask = m.allowed()
    assert mask.dtype == torch.bool and mask.shape == (qwen_info.vocab_size,)
    assert qwen_info.vocab_size > len(qwen_info.token_bytes)
    assert not mask[len(qwen_info.token_bytes) :].any()
    assert not m.can_advance(qwen_info.vocab_size - 1)


def test_advance_rejects_a_masked_token_and_keeps_its_state(smol_info, smol_tokenizer):
    g = compile_grammar("json", smol_info)
    m = g.matcher()
    bad = smol_tokenizer.encode("hello")[0]
    assert not m.allowed()[bad]
    with pytest.raises(GrammarError):
        m.advance(bad)
    for tid in smol_tokenizer.encode("[1]"):
        m.advance(tid)
    assert m.is_accepting()


def test_masks_are_interned_tensors(smol_info, smol_tokenizer):
    g = compile_grammar("json", smol_info)
    a, b = g.matcher(), g.matcher()
    assert a.allowed().data_ptr() == b.allowed().data_ptr()  # one array under both tensors
    for m in (a, b):
        for tid in smol_tokenizer.encode('{"k": [1, 2], "j": [3, 4]}'):
            m.advance(tid)
    assert a.allowed().data_ptr() == b.allowed().data_ptr()
    assert a.allowed().data_ptr() != g.matcher().allowed().data_ptr()  # another mask, another array


def test_is_terminated_only_when_nothing_but_eos_can_follow(smol_info):
    g = compile_grammar("json", smol_info)
    m = g.matcher()
    m.advance_bytes(b"12")
    assert m.is_accepting() and not m.is_terminated()  # more digits may follow
    m = g.matcher()
    m.advance_bytes(b'{"a": 1}')
    assert m.is_terminated()
    m.advance(smol_info.eos_ids[0])
    assert m.is_terminated() and m.finished


@pytest.mark.parametrize("budget", [12, 20, 40])
def test_budget_steering_always_completes_within_budget(info, budget):
    rng = random.Random(budget)
    g = compile_json_schema(PERSON, info)
    lark = g.lark()
    for _ in range(12):
        ids, out, finished = walk(g, info, rng, budget)
        assert finished, out
        assert len(ids) <= budget
        lark.parse(out.decode())
        json.loads(out)


def test_mask_is_never_all_false_even_when_the_budget_is_too_small(smol_info):
    g = compile_json_schema({"type": "string", "minLength": 400}, smol_info)
    m = g.matcher()
    for remaining in (5, 4, 3, 2, 1):
        mask = m.allowed(remaining)
        assert mask.any()
        tid = int(np.flatnonzero(mask.numpy())[0])
        m.advance(tid)
    assert m.shortest_completion() > 0  # could not finish: the engine reports finish_reason "length"


def test_whitespace_stays_bounded_against_a_whitespace_loving_model(smol_info):
    g = compile_json_schema(PERSON, smol_info)
    ws = [i for i, b in enumerate(smol_info.token_bytes) if b and not b.strip(b" \t\r\n")]
    rng = random.Random(0)
    ids, out, finished = walk(
        g, smol_info, rng, 200, bias=sorted(ws, key=lambda i: -len(smol_info.token_bytes[i]))
    )
    assert finished
    text = out.decode()
    assert json.loads(text) is not None
    import re

    structure = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)  # whitespace inside strings is content
    for run in re.findall(r"[ \t\r\n]+", structure):
        assert len(run) <= 22, repr(run)  # one space/tab, or a newline plus at most 20 of indent
        assert run.count("\n") <= 1


def test_compact_and_pretty_json_are_accepted(smol_info, smol_tokenizer):
    g = compile_grammar("json", smol_info)
    value = {"a": 1, "b": [2, 3], "c": {"d": None, "e": "x"}, "f": -1.5e-3, "g": True}
    for text in (
        json.dumps(value, separators=(",", ":")),
        json.dumps(value),
        json.dumps(value, indent=2),
        json.dumps(value, indent="\t"),
    ):
        assert first_rejection(g, smol_tokenizer.encode(text)) is None, text


def test_unicode_in_strings_keys_and_enums(info, request):
    tokenizer = request.getfixturevalue("smol_tokenizer" if info.vocab_size == 49152 else "qwen_tokenizer")
    schema = {
        "type": "object",
        "properties": {"東京": {"enum": ["café", "😀", "naïve"]}, "ü": {"type": "string"}},
        "required": ["東京", "ü"],
    }
    g = compile_json_schema(schema, info)
    for value in ({"東京": "😀", "ü": "Ærø ☃ 𝄞"}, {"東京": "café", "ü": ""}):
        for ensure_ascii in (False, True):
            text = json.dumps(value, ensure_ascii=ensure_ascii)
            assert first_rejection(g, tokenizer.encode(text, add_special_tokens=False)) is None, text
    assert (
        first_rejection(g, tokenizer.encode('{"東京": "cafe", "ü": ""}', add_special_tokens=False))
        is not None
    )


def test_saved_mask_cache_gives_the_same_masks(smol_info, smol_tokenizer, tmp_path):
    g = compile_grammar("json", smol_info)
    m = g.matcher()
    for tid in smol_tokenizer.encode('{"key": "val'):
        m.advance(tid)
    before = m.allowed().clone()
    path = tmp_path / "masks.npz"
    assert RunCache.of(smol_info).save_cache(path) > 0
    fresh = TokenizerInfo(
        smol_info.token_bytes,
        vocab_size=smol_info.vocab_size,
        eos_ids=smol_info.eos_ids,
        special=smol_info.special_text,
    )
    assert RunCache.of(fresh).load_cache(path) > 0
    g2 = compile_grammar("json", fresh)
    m2 = g2.matcher()
    for tid in smol_tokenizer.encode('{"key": "val'):
        m2.advance(tid)
    assert torch.equal(m2.allowed(), before)


def test_copy_is_independent(smol_info):
    g = compile_grammar("json", smol_info)
    m = g.matcher()
    m.advance_bytes(b"[1")
    c = m.copy()
    c.advance_bytes(b"]")
    assert c.is_accepting() and not m.is_accepting()
