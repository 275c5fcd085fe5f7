"""Grammar masks over Gemma 3 270M's 262,144-token vocabulary (SentencePiece with byte fallback): its
token bytes, masks against a brute-force check of every token, schema instances token by token, and EOS
exactly where the output is complete. Its ``<0x2E>``-style byte tokens repeat 110 one-byte pieces, which
a byte-level BPE vocabulary (SmolLM2's) never does."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import jsonschema
import numpy as np
import pytest
from grammar_helpers import brute_mask, first_rejection, random_split

from radixchat.grammar import TokenizerInfo, compile_grammar, compile_json_schema

pytestmark = pytest.mark.gemma

EOS = ("<eos>", "<end_of_turn>")  # a document's end and a chat reply's: the engine stops on both

EVENT = {
    "type": "object",
    "properties": {
        "event.name": {"type": "string", "maxLength": 40},
        "guests": {"type": "integer", "minimum": 0, "maximum": 500},
        "tags": {"type": "array", "items": {"enum": ["work", "family", "café"]}, "maxItems": 3},
        "where": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "online": {"type": "boolean"}},
            "required": ["city"],
        },
    },
    "required": ["event.name", "guests"],
    "additionalProperties": False,
}
VALID = [
    {"event.name": "Booleans.parseBooleanLenient", "guests": 12},
    {"event.name": "Dîner à 8h  (東京)", "guests": 0, "tags": ["café", "work"], "where": {"city": "Paris"}},
    {"event.name": "", "guests": 500, "where": {"city": 'a\nb "q"', "online": True}},
]
INVALID = [
    {"guests": 12},  # a required member missing
    {"event.name": "x", "guests": 501},  # out of range
    {"event.name": "x", "guests": 1.5},  # not an integer
    {"event.name": "x", "guests": 1, "tags": ["home"]},  # not in the enum
    {"event.name": "x", "guests": 1, "extra": 1},  # an undeclared member of a closed object
    {"event.name": "x" * 41, "guests": 1},  # too long
]


@pytest.fixture(scope="module")
def gemma_info(gemma_tokenizer) -> TokenizerInfo:
    vocab = gemma_tokenizer.get_vocab()
    return TokenizerInfo.from_tokenizer(gemma_tokenizer, eos_ids=[vocab[t] for t in EOS])


@pytest.fixture(scope="module")
def event(gemma_info):
    return compile_json_schema(EVENT, gemma_info, cache=False)


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_token_bytes_agree_with_the_tokenizers_own_decoding(gemma_tokenizer, gemma_info):
    n = len(gemma_tokenizer)
    assert n == 262_144 and gemma_info.vocab_size == n
    texts = gemma_tokenizer.backend_tokenizer.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    text_tokens = 0
    for i, data in enumerate(gemma_info.token_bytes):
        if data is not None:
            assert data.decode("utf-8", "replace") == texts[i], i
            text_tokens += 1
    assert text_tokens > 255_000
    byte_dot = gemma_tokenizer.convert_tokens_to_ids("<0x2E>")
    assert (
        gemma_info.token_bytes[byte_dot]
        == b"."
        == gemma_info.token_bytes[gemma_tokenizer.convert_tokens_to_ids(".")]
    )
    assert all(gemma_info.token_bytes[gemma_tokenizer.convert_tokens_to_ids(t)] is None for t in EOS)


@pytest.mark.parametrize("value", VALID, ids=range(len(VALID)))
def test_valid_instances_pass_token_by_token(gemma_tokenizer, gemma_info, event, value):
    jsonschema.validate(value, EVENT)
    rng = random.Random(3)
    for text in (_compact(value), json.dumps(value, ensure_ascii=False), json.dumps(value, indent=2)):
        assert first_rejection(event, gemma_tokenizer.encode(text, add_special_tokens=False)) is None, text
        for _ in range(2):  # other ways to write it: byte tokens (<0x..>) and shorter pieces
            assert first_rejection(event, random_split(text.encode(), gemma_info, rng)) is None, text


@pytest.mark.parametrize("value", INVALID, ids=range(len(INVALID)))
def test_invalid_instances_are_rejected(gemma_tokenizer, event, value):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(value, EVENT)
    assert (
        first_rejection(event, gemma_tokenizer.encode(_compact(value), add_special_tokens=False)) is not None
    )


def test_masks_equal_a_brute_force_check_of_every_token(gemma_tokenizer, gemma_info, event):
    """States across an instance: the object's start, inside a key with a dot, a string value with
    spaces and non-ASCII, a number, an enum, a nested object, the end; then the plain JSON grammar."""
    text = _compact(VALID[1])
    ids = gemma_tokenizer.encode(text, add_special_tokens=False)
    m = event.matcher()
    checked = 0
    for k, tid in enumerate([*ids, None]):
        if k % 3 == 0 or tid is None:
            assert np.array_equal(m.allowed().numpy(), brute_mask(m, gemma_info)), gemma_tokenizer.decode(
                ids[:k]
            )
            checked += 1
        if tid is not None:
            m.advance(tid)
    assert checked >= 6
    json_grammar = compile_grammar("json", gemma_info)
    for piece in (b"", b'{"k', b'{"key": "v\xc3\xa9', b'{"key": [1, -2.', b'{"key": [1, -2.5e'):
        m = json_grammar.matcher()
        if piece:
            m.advance_bytes(piece)
        assert np.array_equal(m.allowed().numpy(), brute_mask(m, gemma_info)), piece


def test_tokens_with_the_same_bytes_get_the_same_bit(gemma_info, event, gemma_tokenizer):
    twins: dict[bytes, list[int]] = defaultdict(list)
    for i, data in enumerate(gemma_info.token_bytes):
        if data is not None:
            twins[data].append(i)
    twins = {b: ids for b, ids in twins.items() if len(ids) > 1}
    assert len(twins) >= 100  # the byte tokens of printable ASCII and some controls
    groups = list(twins.values())
    m = event.matcher()
    seen_both = 0
    for tid in gemma_tokenizer.encode(_compact(VALID[0]), add_special_tokens=False):
        mask = m.allowed().numpy()
        for ids in groups:
            assert len({bool(mask[i]) for i in ids}) == 1, [gemma_info.token_bytes[i] for i in ids]
            seen_both += bool(mask[ids[0]])
        m.advance(tid)
    assert seen_both > 0


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        (EVENT, VALID[1]),
        ({"type": "integer"}, 1234567),
        ({"type": "array", "items": {"type": "number"}}, [1, 2.5]),
    ],
    ids=["object", "integer", "array"],
)
def test_eos_allowed_exactly_when_complete(gemma_tokenizer, gemma_info, schema, value):
    """At every prefix of an instance, both EOS ids are allowed iff the prefix is itself a complete valid
    instance (an integer's digits are, one by one; an object is only at its last brace)."""
    g = compile_json_schema(schema, gemma_info, cache=False)
    ids = gemma_tokenizer.encode(_compact(value), add_special_tokens=False)
    m = g.matcher()
    complete_seen = 0
    for k in range(len(ids) + 1):
        prefix = gemma_tokenizer.decode(ids[:k])
        try:
            jsonschema.validate(json.loads(prefix), schema)
            complete = True
        except (json.JSONDecodeError, jsonschema.ValidationError):
            complete = False
        mask = m.allowed().numpy()
        assert all(bool(mask[e]) == complete for e in gemma_info.eos_ids), prefix
        assert m.is_accepting() == complete
        complete_seen += complete
        if k < len(ids):
            m.advance(ids[k])
    assert complete_seen >= 1
    m.advance(gemma_info.eos_ids[-1])
    assert m.is_terminated()
