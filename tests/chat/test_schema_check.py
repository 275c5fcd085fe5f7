"""The final check of JSON-mode replies (lenient mode's safety net), with JSON Schema's own validator."""

from __future__ import annotations

from radixchat.chat.schema_check import schema_errors


def test_a_valid_reply_has_no_errors():
    assert schema_errors({"type": "array", "uniqueItems": True}, "[1, 2]") == []


def test_each_broken_keyword_is_named_with_its_pointer():
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "uniqueItems": True}, "n": {"multipleOf": 0.5}},
        "not": {"required": ["forbidden"]},
    }
    errors = schema_errors(schema, '{"tags": [1, 1], "n": 0.3, "forbidden": true}')
    assert len(errors) == 3
    assert any(e.startswith("#/tags:") and "(uniqueItems)" in e for e in errors)
    assert any(e.startswith("#/n:") and "(multipleOf)" in e for e in errors)
    assert any(e.startswith("#:") and "(not)" in e for e in errors)


def test_text_that_is_not_json_says_so():
    assert schema_errors(None, '{"a": ')[0].startswith("the reply is not JSON")
    assert schema_errors(None, "[1]") != []  # no schema: any JSON object


def test_unenforced_keywords_are_found_where_they_are():
    from radixchat.chat.schema_check import unenforced_keywords

    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "uniqueItems": True},
            "n": {"multipleOf": 1},
            "even": {"enum": [2, 3, 4], "multipleOf": 2},  # a list: the grammar keeps 2 and 4 only
        },
        "anyOf": [{"not": {"required": ["x"]}}],
        "$defs": {"d": {"if": {"type": "string"}, "then": {"minLength": 1}}},
    }
    assert unenforced_keywords(schema) == [
        "uniqueItems at #/properties/tags",
        "if at #/$defs/d",
        "then at #/$defs/d",
        "not at #/anyOf/0",
    ]


def test_the_torch_free_keyword_list_is_the_grammars():
    from radixchat.chat.schema_check import UNENFORCED
    from radixchat.grammar.schema.json_schema import UNSUPPORTED

    assert UNENFORCED == UNSUPPORTED
