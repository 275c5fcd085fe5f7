"""Tool calls: names restricted to the declared tools, arguments checked by their schemas, tool_choice."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from grammar_helpers import first_rejection, walk

from radixchat.grammar import GrammarError, compile_grammar, compile_tool_call_grammar, parse_tool_calls

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "minLength": 1}, "unit": {"enum": ["C", "F"]}},
                "required": ["city"],
            },
        },
    },
    {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
    {"name": "now", "description": "The time; no parameters"},
]
SCHEMAS = {
    "get_weather": TOOLS[0]["function"]["parameters"],
    "add": TOOLS[1]["parameters"],
    "now": {"type": "object", "properties": {}, "additionalProperties": False},
}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def _ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_auto_accepts_free_text_or_calls(info, request):
    tok = request.getfixturevalue("smol_tokenizer" if info.vocab_size == 49152 else "qwen_tokenizer")
    g = compile_tool_call_grammar(TOOLS, info, "auto")
    assert first_rejection(g, _ids(tok, "The weather is sunny < 30°C.\nBye")) is None
    assert first_rejection(g, _ids(tok, CALL)) is None
    two = compile_tool_call_grammar(TOOLS, info, "auto", max_calls=2)  # the default allows one call
    assert first_rejection(two, _ids(tok, CALL + "\n" + CALL.replace('"a": 1', '"a": -5'))) is None
    assert first_rejection(g, _ids(tok, '<tool_call>{"name": "now", "arguments": {}}</tool_call>')) is None


def test_auto_text_may_not_start_a_malformed_call(smol_info, smol_tokenizer):
    g = compile_tool_call_grammar(TOOLS, smol_info, "auto")
    assert (
        first_rejection(g, _ids(smol_tokenizer, '<tool_call>{"name": "rm", "arguments": {}}</tool_call>'))
        is not None
    )
    assert (
        first_rejection(
            g, _ids(smol_tokenizer, '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        )
        is not None
    )
    assert first_rejection(g, _ids(smol_tokenizer, "<tool_call>hello")) is not None


def test_required_named_and_none(smol_info, smol_tokenizer):
    required = compile_tool_call_grammar(TOOLS, smol_info, "required")
    assert first_rejection(required, _ids(smol_tokenizer, "Sure!")) == 0
    assert first_rejection(required, _ids(smol_tokenizer, CALL)) is None
    named = compile_tool_call_grammar(
        TOOLS, smol_info, {"type": "function", "function": {"name": "get_weather"}}
    )
    assert first_rejection(named, _ids(smol_tokenizer, CALL)) is not None
    assert (
        first_rejection(
            named,
            _ids(
                smol_tokenizer,
                '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}</tool_call>',
            ),
        )
        is None
    )
    assert first_rejection(named, _ids(smol_tokenizer, CALL.replace("add", "get_weather") + CALL)) is not None
    none = compile_tool_call_grammar(TOOLS, smol_info, "none")
    assert first_rejection(none, _ids(smol_tokenizer, "Plain answer.")) is None
    assert first_rejection(none, _ids(smol_tokenizer, CALL)) is not None


def test_qwen_single_token_tags_are_allowed(qwen_info, qwen_tokenizer):
    tag = qwen_tokenizer.convert_tokens_to_ids("<tool_call>")
    m = compile_tool_call_grammar(TOOLS, qwen_info, "required").matcher()
    assert m.allowed()[tag]


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_sampled_calls_parse_and_validate(info, choice):
    g = compile_tool_call_grammar(TOOLS, info, choice)
    lark = g.lark()
    rng = random.Random(choice)
    model_like = (CALL + '{"name": "get_weather", "arguments": {"city": "Oslo"}}').encode()
    tags = [i for i, b in enumerate(info.token_bytes) if b and b in model_like]  # a model that likes calls
    calls = 0
    for _ in range(10):
        _, out, finished = walk(g, info, rng, 120, bias=tags)
        assert finished, out
        text = out.decode()
        lark.parse(text)
        parsed = parse_tool_calls(text)
        for call in parsed.calls:
            jsonschema.validate(call["arguments"], SCHEMAS[call["name"]])
            calls += 1
        if choice == "required":
            assert parsed.calls and not parsed.content
    assert calls > 0 or choice == "auto"


def test_parse_tool_calls_splits_text_and_calls():
    text = "Let me check.\n" + CALL + '\n<tool_call>{"name": "now", "arguments": "{}"}</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me check."
    assert parsed.calls == [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "now", "arguments": {}}]
    broken = parse_tool_calls("x <tool_call>{not json}</tool_call>")
    assert broken.calls == [] and "{not json}" in broken.content


def test_tool_declaration_errors(smol_info):
    with pytest.raises(GrammarError, match="undeclared"):
        compile_tool_call_grammar(TOOLS, smol_info, {"name": "nope"})
    with pytest.raises(GrammarError, match="unique"):
        compile_tool_call_grammar(TOOLS + TOOLS[1:2], smol_info)
    with pytest.raises(GrammarError, match="tool_choice"):
        compile_tool_call_grammar(TOOLS, smol_info, "sometimes")


def test_static_tool_call_grammar_file(smol_info, smol_tokenizer):
    g = compile_grammar("tool_call.lark", smol_info)
    assert first_rejection(g, _ids(smol_tokenizer, CALL)) is None
    assert first_rejection(g, _ids(smol_tokenizer, "just text")) is None
    assert json.loads(CALL.split("\n")[1])["name"] == "add"


def test_another_block_opens_only_while_the_budget_covers_the_longest_so_far(smol_info, smol_tokenizer):
    g = compile_tool_call_grammar(TOOLS, smol_info, "required", max_calls=3)
    eos = sorted(smol_info.eos_ids)
    m = g.matcher()
    for t in _ids(smol_tokenizer, "\n" + CALL + "\n"):
        m.advance(t)
    block = len(CALL.encode())  # the steering's measure: bytes, tags included
    roomy = m.allowed(block + 2)  # between blocks, with room for one as long as the first
    assert roomy.sum() > len(eos) and not m.budget_limited
    tight = m.allowed(block + 1)
    assert tight.nonzero().flatten().tolist() == eos and m.budget_limited
    fork = m.copy()  # copies keep what they measured
    assert fork.allowed(block + 1).nonzero().flatten().tolist() == eos
    assert fork.allowed(None).sum() > len(eos)  # no budget: no steering
    # A tag split across tokens is still seen, and inside a block the rule does not apply: a block that
    # was opened is finished by the steering, not cut.
    for t in [smol_tokenizer.convert_tokens_to_ids(c) for c in "<tool"] + _ids(smol_tokenizer, "_call>"):
        m.advance(t)
    assert not m.is_accepting()
    assert not m.allowed(block + 1)[eos].any()
    longer = CALL.replace('"a": 1', '"a": 123456')
    for t in _ids(smol_tokenizer, longer[len("<tool_call>") :]):
        m.advance(t)
    assert m.allowed(len(longer.encode()) + 1).nonzero().flatten().tolist() == eos  # the longest counts
