"""The ``<tool_call>`` format has one home (``radixchat.tool_format``), torch-free, used by every layer."""

from __future__ import annotations

import json

import pytest

from radixchat.tool_format import parse_tool_calls, strip_tool_calls, tool_call_dicts


def block(name: str, arguments: object) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "calls", "content"),
    [
        (block("a", {"x": 1}), [{"name": "a", "arguments": {"x": 1}}], ""),
        # arguments written as a JSON string are decoded
        (
            'hi <tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call> bye',
            [{"name": "b", "arguments": {"y": 2}}],
            "hi  bye",
        ),
        # blocks that are no call stay in the text
        ("<tool_call>{not json}</tool_call>", [], "<tool_call>{not json}</tool_call>"),
        ('<tool_call>{"arguments": {}}</tool_call>', [], '<tool_call>{"arguments": {}}</tool_call>'),
        ("plain text", [], "plain text"),
        (
            block("a", {}) + block("c", {"z": [1]}),
            [{"name": "a", "arguments": {}}, {"name": "c", "arguments": {"z": [1]}}],
            "",
        ),
        (block("x", {}) + "\n\nok", [{"name": "x", "arguments": {}}], "ok"),
    ],
)
def test_calls_are_parsed_and_the_rest_is_kept(text, calls, content):
    parsed = parse_tool_calls(text)
    assert parsed.calls == calls and parsed.content == content
    assert tool_call_dicts(text) == calls and strip_tool_calls(text) == content


def test_the_grammar_layer_re_exports_the_one_parser():
    """One home: grammar's names are tool_format's objects (and tool_format needs no torch:
    tests/test_layering.py)."""
    from radixchat import grammar, tool_format

    assert grammar.parse_tool_calls is tool_format.parse_tool_calls
    assert grammar.ToolCall is tool_format.ToolCall
