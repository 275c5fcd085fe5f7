"""The x-grammar extension: a JSON string whose content follows a Lark grammar (calculator expressions)."""

from __future__ import annotations

import json

import pytest

from radixchat.chat.tools import CALCULATOR_GRAMMAR, builtin_tools, calculate, string_grammar_problem
from radixchat.grammar import GrammarError, compile_json_schema, compile_tool_call_grammar

CALC = {
    "type": "object",
    "properties": {"e": {"type": "string", "x-grammar": CALCULATOR_GRAMMAR}},
    "required": ["e"],
}


@pytest.fixture(scope="module")
def calc(smol_info):
    return compile_json_schema(CALC, smol_info)


def accepts(g, text: str) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text.encode())
    except GrammarError:
        return False
    return m.is_accepting()


@pytest.mark.parametrize(
    "expr", ["1234 * 5678", "((2 + 3) * (7 - 4)) ** 2", "3.5*4.2", "17 % 5", "1000000 / 250"]
)
def test_valid_expressions_are_accepted_and_evaluate(calc, expr):
    assert accepts(calc, json.dumps({"e": expr}))
    calculate(expr)  # what the grammar allows, the calculator evaluates


def test_json_escaping_of_the_content_is_accepted(calc):
    assert accepts(calc, '{"e": "8 \\/ 2"}')  # "/" may be written escaped
    assert json.loads('{"e": "8 \\/ 2"}')["e"] == "8 / 2"


@pytest.mark.parametrize("expr", ["(1 + 2", "1 + 2)", "{12} * 30", "x + 1", " 1", "1 +\n2", ""])
def test_unbalanced_or_foreign_content_is_rejected(calc, expr):
    assert not accepts(calc, json.dumps({"e": expr}))


def test_no_json_whitespace_inside_the_string(calc):
    assert accepts(calc, '{"e": "1+2"}')
    assert not accepts(calc, '{"e": "1+\t2"}')


def test_a_broken_grammar_is_reported_against_its_place(smol_info):
    bad = {"type": "object", "properties": {"q": {"type": "string", "x-grammar": "start: A B\nA: /a/"}}}
    with pytest.raises(GrammarError, match="tool .t.: #/properties/q: x-grammar: Rule .B. used"):
        compile_tool_call_grammar([{"name": "t", "parameters": bad}], smol_info, "required")
    assert "x-grammar at #/properties/q" in string_grammar_problem(bad)


def test_time_zone_is_an_iana_name_or_absent(smol_info):
    now = builtin_tools()["now"].schema()
    g = compile_tool_call_grammar([now], smol_info, "required")
    call = '<tool_call>{"name": "now", "arguments": %s}</tool_call>'
    assert accepts(g, call % '{"timezone": "Asia/Tokyo"}')
    assert accepts(g, call % "{}")
    assert not accepts(g, call % '{"timezone": "Mars/Base"}')


def test_auto_allows_text_then_a_call_and_max_calls_bounds_blocks(smol_info):
    now = builtin_tools()["now"].schema()
    block = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    one = compile_tool_call_grammar([now], smol_info, "auto", max_calls=1)
    two = compile_tool_call_grammar([now], smol_info, "auto", max_calls=2)
    assert accepts(one, "Let me look. " + block)
    assert accepts(one, "Just text.") and accepts(one, block)
    assert not accepts(one, block + block)
    assert accepts(two, block + "\n" + block)
    assert not accepts(one, "a" + block + " more text")
