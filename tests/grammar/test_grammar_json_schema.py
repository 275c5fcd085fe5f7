"""JSON Schema: soundness (outputs validate), completeness (valid instances are never masked),
rejection of invalid instances, and clear errors for what we do not support."""

from __future__ import annotations

import itertools
import json
import random
import warnings

import jsonschema
import numpy as np
import pytest
from grammar_helpers import brute_mask, dumps_variants, first_rejection, tokenizations, walk
from grammar_schema_cases import CASES

from radixchat.grammar import (
    CompiledGrammar,
    GrammarError,
    GrammarWarning,
    UnenforceableSchema,
    compile_json_schema,
    json_schema_to_lark,
)

IDS = [c["name"] for c in CASES]


def _validator(schema):
    cls = jsonschema.Draft202012Validator
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def test_corpus_valid_instances_really_validate():
    for case in CASES:
        v = _validator(case["schema"])
        for inst in case["valid"]:
            v.validate(inst)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_valid_instances_are_never_masked(case, info, request):
    tokenizer = request.getfixturevalue("smol_tokenizer" if info.vocab_size == 49152 else "qwen_tokenizer")
    g = compile_json_schema(case["schema"], info)
    rng = random.Random(case["name"])
    for inst in case["valid"]:
        texts = dumps_variants(inst)
        for text in (texts[0], texts[-1]):
            for ids in tokenizations(text, tokenizer, info, rng, n_random=1):
                assert first_rejection(g, ids) is None, (text, ids)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_invalid_instances_are_rejected_at_some_prefix(case, smol_info, smol_tokenizer):
    g = compile_json_schema(case["schema"], smol_info)
    for inst in case["invalid"]:
        text = json.dumps(inst, ensure_ascii=False)
        assert first_rejection(g, smol_tokenizer.encode(text)) is not None, text


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_random_walk_outputs_parse_with_lark_and_validate(case, info):
    g = compile_json_schema(case["schema"], info)
    lark = g.lark()
    validator = _validator(case["schema"])
    rng = random.Random(case["name"])
    for _ in range(6):
        _, out, finished = walk(g, info, rng, 96)
        assert finished, out  # never stuck, always complete within budget
        text = out.decode()
        lark.parse(text)
        validator.validate(json.loads(text))


@pytest.mark.parametrize(
    "keyword, schema, pointer",
    [
        ("uniqueItems", {"type": "array", "uniqueItems": True}, "#/uniqueItems"),
        ("contains", {"type": "array", "contains": {"type": "integer"}}, "#/contains"),
        ("not", {"properties": {"a": {"not": {"type": "string"}}}}, "#/properties/a/not"),
        ("if", {"if": {"type": "string"}, "then": {"minLength": 1}}, "#/if"),
        ("dependencies", {"type": "object", "dependencies": {"a": ["b"]}}, "#/dependencies"),
    ],
)
def test_unsupported_keywords_name_the_keyword_and_pointer(smol_info, keyword, schema, pointer):
    with pytest.raises(GrammarError) as e:
        compile_json_schema(schema, smol_info, cache=False)
    assert keyword in str(e.value) and pointer in str(e.value)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "array", "uniqueItems": True}, "unsupported keyword 'uniqueItems' at #/uniqueItems"),
        ({"type": "string", "format": "iri"}, "unsupported format 'iri' at #/format"),
        ({"oneOf": [{"pattern": "^a"}, {"type": "integer"}]}, "branches 0 and 1 are not provably disjoint"),
        ({"type": "string", "pattern": "(a)\\1"}, "unsupported regex construct"),
    ],
)
def test_what_only_lenient_mode_can_run_is_refused_as_unenforceable(smol_info, schema, message):
    """Front ends offer lenient mode on the type (``UnenforceableSchema``), not on the message's words."""
    with pytest.raises(UnenforceableSchema, match=message):
        compile_json_schema(schema, smol_info, cache=False)


def test_a_schema_that_is_wrong_is_not_unenforceable(smol_info):
    with pytest.raises(GrammarError, match="remote") as e:
        compile_json_schema({"$ref": "https://example.com/s.json"}, smol_info, cache=False)
    assert not isinstance(e.value, UnenforceableSchema)


def test_lenient_ignores_unsupported_keywords_with_a_warning(smol_info):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = compile_json_schema(
            {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
            smol_info,
            lenient=True,
            cache=False,
        )
    assert any(issubclass(x.category, GrammarWarning) and "uniqueItems" in str(x.message) for x in w)
    m = g.matcher()
    m.advance_bytes(b"[1,1]")
    assert m.is_accepting()


def test_remote_ref_is_rejected(smol_info):
    with pytest.raises(GrammarError, match="remote"):
        compile_json_schema({"$ref": "https://example.com/s.json"}, smol_info, cache=False)


def test_long_minimum_arrays_compile_and_absurd_ones_are_refused(smol_info):
    """minItems 1000 used to recurse once per item and overflow Python's stack."""
    g = compile_json_schema({"type": "array", "minItems": 1000, "items": {"type": "integer"}}, smol_info)
    m = g.matcher()
    m.advance_bytes(b"[" + b",".join([b"7"] * 999))
    assert not m.is_accepting()
    m.advance_bytes(b",7]")
    assert m.is_accepting()
    with pytest.raises(GrammarError, match="minItems at #/properties/a/minItems is too large"):
        compile_json_schema({"properties": {"a": {"minItems": 10**6}}}, smol_info, cache=False)


def test_a_recursive_ref_inside_anyof_compiles_as_pydantic_writes_optional_self(smol_info):
    node = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "child": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/Node",
    }
    g = compile_json_schema(node, smol_info, cache=False)
    for text, valid in [
        (b'{"v":1,"child":{"v":2,"child":{"v":3,"child":null}}}', True),
        (b'{"v":1,"child":{}}', False),
        (b'{"v":1,"child":5}', False),
    ]:
        m = g.matcher()
        try:
            m.advance_bytes(text)
            accepted = m.is_accepting()
        except GrammarError:
            accepted = False
        assert accepted == valid, text
    with pytest.raises(GrammarError, match="recurses without consuming input"):  # left recursion
        compile_json_schema(
            {"$defs": {"S": {"anyOf": [{"$ref": "#/$defs/S"}, {"type": "string"}]}}, "$ref": "#/$defs/S"},
            smol_info,
            cache=False,
        )


def _accepts(g, text: bytes) -> bool:
    m = g.matcher()
    try:
        m.advance_bytes(text)
    except GrammarError:
        return False
    return m.is_accepting()


def test_an_extra_key_cannot_spell_a_declared_one_with_escapes(smol_info):
    """``{"\u006b": 5}`` decodes to key "k": it bypassed properties.k through additionalProperties."""
    g = compile_json_schema(
        {
            "type": "object",
            "properties": {"k": {"type": "string"}, 'a"b': {"type": "string"}},
            "additionalProperties": {"type": "integer"},
        },
        smol_info,
        cache=False,
    )
    for text in [b'{"\\u006b":5}', b'{"k":"x","\\u006b":5}', b'{"a\\u0022b":5}']:
        assert not _accepts(g, text), text
    for text in [b'{"k":"x","z":5}', b'{"\\u00e9":5}', b'{"k\\u00e9":5}', b'{"a\\"b":"s"}']:
        assert _accepts(g, text), text


def test_property_names_with_a_pattern_and_a_length_compile(smol_info):
    """Both constraints became nested look-aheads, which the lexer refused with an internal message."""
    g = compile_json_schema(
        {"propertyNames": {"pattern": "^a", "maxLength": 3}, "additionalProperties": True},
        smol_info,
        cache=False,
    )
    assert [_accepts(g, t) for t in (b'{"abc":1}', b'{"abcd":1}', b'{"b":1}', b"{}")] == [
        True,
        False,
        False,
        True,
    ]


def test_del_may_be_escaped_as_json_dumps_does(smol_info):
    for schema in ({"const": "\x7f"}, {"type": "string", "pattern": "^[^a]*$"}):
        g = compile_json_schema(schema, smol_info, cache=False)
        assert _accepts(g, json.dumps("\x7f").encode()) and json.dumps("\x7f") == '"\\u007f"'


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"const": 5, "minimum": 10}, "accepts no value"),
        ({"enum": ["a"], "properties": {"a": {"$ref": "#/$defs/s"}}, "$defs": {"s": {}}}, "uses \\$ref"),
        ({"enum": ["a"], "maxLength": "two"}, "'maxLength' next to enum at #: 'two' is not of type"),
        ({"type": "object", "required": ["a"], "additionalProperties": False}, "accepts no value"),
        (
            {"properties": {"a": {"$ref": "#str"}}, "$defs": {"s": {"$anchor": "str", "type": "string"}}},
            "anchors are not supported",
        ),
        ({"oneOf": [{"pattern": "^a"}, {"type": "integer"}]}, "branches 0 and 1 are not provably disjoint"),
        (
            {
                "oneOf": [
                    {"properties": {"k": {"const": 1}}, "required": ["k"], "additionalProperties": True},
                    {"properties": {"k": {"const": 1.0}}, "required": ["k"], "additionalProperties": True},
                ]
            },
            # 1 == 1.0: every object valid under one branch is valid under both, and so is every other
            # kind (no type): nothing is valid. Narrowing a branch never to hold what it requires itself
            # would leave it no value, so nothing proves the branches apart: refused, not emptied.
            "not provably disjoint",
        ),
    ],
)
def test_constraints_the_grammar_would_not_apply_are_refused(smol_info, schema, message):
    """Each of these compiled and then allowed values the schema rejects."""
    with pytest.raises(GrammarError, match=message):
        compile_json_schema(schema, smol_info, cache=False)


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        ({"enum": ["a", "abc"], "maxLength": 2}, ['"a"'], ['"abc"']),
        ({"allOf": [{"enum": ["a", "abc"]}, {"maxLength": 2}]}, ['"a"'], ['"abc"']),
        ({"enum": [1, 2, 3, 4, "x"], "multipleOf": 2}, ["2", "4", '"x"'], ["1", "3"]),
        ({"const": {"a": 1}, "required": ["a"], "maxProperties": 1}, ['{"a":1}'], ['{"a":2}']),
        # keywords the grammar cannot enforce on open values are exact on a list
        ({"enum": [[1, 1], [1, 2]], "uniqueItems": True}, ["[1,2]"], ["[1,1]"]),
        ({"enum": ["a", "b"], "not": {"const": "a"}}, ['"b"'], ['"a"']),
        # draft-04's boolean exclusiveMaximum, read in the root's draft
        (
            {
                "$schema": "http://json-schema.org/draft-04/schema#",
                "enum": [1, 2],
                "maximum": 2,
                "exclusiveMaximum": True,
            },
            ["1"],
            ["2"],
        ),
    ],
)
def test_keywords_beside_enum_and_const_filter_the_listed_values(smol_info, schema, valid, invalid):
    """JSON Schema applies both; these were refused ("list only valid values"), now the values that
    the other keywords reject are dropped."""
    g = compile_json_schema(schema, smol_info, cache=False)
    assert all(_accepts(g, t.encode()) for t in valid), valid
    assert not any(_accepts(g, t.encode()) for t in invalid), invalid


def test_a_required_name_the_object_does_not_declare_takes_any_value(smol_info):
    """Objects that declare properties are closed by default (``additionalProperties`` auto), but a name
    in ``required`` is declared by being required: closing must not make the schema accept nothing."""
    g = compile_json_schema(
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}, smol_info, cache=False
    )
    for text in ['{"b":1}', '{"a":"s","b":null}', '{"b":{"x":[1,"y"]}}']:
        assert _accepts(g, text.encode()), text
    for text in ['{"a":"s"}', '{"b":1,"c":2}', "{}"]:
        assert not _accepts(g, text.encode()), text


_AB = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}
_DRAFT7 = "http://json-schema.org/draft-07/schema#"  # where "dependencies" is a keyword


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        (
            {"$schema": _DRAFT7, "type": "object", "properties": _AB, "dependencies": {"a": ["b"]}},
            ['{"a":1,"b":2}', '{"b":2}', "{}", '{"b":1,"c":1}'],
            ['{"a":1}', '{"a":1,"c":2}'],
        ),
        (  # draft 2019's name, and a name that requires one the object never writes
            {"type": "object", "properties": _AB, "dependentRequired": {"c": ["z"]}},
            ['{"a":1,"b":2}'],
            ['{"c":1}'],
        ),
        (
            {"type": "object", "properties": _AB, "not": {"required": ["a", "b"]}},
            ['{"a":1}', '{"b":2,"c":3}', "{}"],
            ['{"a":1,"b":2}'],
        ),
        (  # OpenRTB: "site" and "app" not both
            {
                "type": "object",
                "properties": _AB,
                "not": {"allOf": [{"required": ["a"]}, {"required": ["b"]}]},
            },
            ['{"a":1,"c":2}', '{"b":1}'],
            ['{"a":1,"b":2}'],
        ),
        (
            {
                "type": "object",
                "properties": _AB,
                "not": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
            },
            ["{}", '{"c":1}'],
            ['{"a":1}', '{"b":1}'],
        ),
        (  # merged from allOf branches
            {
                "$schema": _DRAFT7,
                "allOf": [{"type": "object", "properties": _AB}, {"dependencies": {"a": ["b"]}}],
            },
            ['{"a":1,"b":2}'],
            ['{"a":1}'],
        ),
    ],
)
def test_presence_only_not_and_dependencies_are_enforced(smol_info, schema, valid, invalid):
    g = compile_json_schema(schema, smol_info, cache=False)
    for text in valid:
        assert jsonschema.validators.validator_for(schema)(schema).is_valid(json.loads(text)), text
        assert _accepts(g, text.encode()), text
    for text in invalid:
        assert not jsonschema.validators.validator_for(schema)(schema).is_valid(json.loads(text)), text
        assert not _accepts(g, text.encode()), text


@pytest.mark.parametrize(
    "schema",
    [
        {"not": {"required": ["a"]}},  # no type: every non-object is invalid too
        {"type": "object", "additionalProperties": True, "not": {"required": ["a"]}},  # "a" as an extra key
        {"type": "object", "properties": _AB, "dependencies": {"a": {"required": ["b"]}}},  # a schema
        {"type": "object", "properties": _AB, "not": {"properties": {"a": {"const": 1}}}},
    ],
)
def test_other_not_and_dependencies_stay_refused(smol_info, schema):
    with pytest.raises(GrammarError, match="unsupported keyword"):
        compile_json_schema(schema, smol_info, cache=False)


def test_other_tools_extension_keywords_are_annotations(smol_info):
    branch = {"type": "object", "properties": {"a": {"type": "integer"}}, "x-docs": "one"}
    g = compile_json_schema({"allOf": [branch, {**branch, "x-docs": "two"}]}, smol_info, cache=False)
    assert _accepts(g, b'{"a":1}') and not _accepts(g, b'{"a":"s"}')
    # a $ref with only annotations beside it is a plain reference: here, a recursive one
    node = {"type": "object", "properties": {"child": {"$ref": "#/$defs/n", "x-docs": "the child"}}}
    g = compile_json_schema({"$defs": {"n": node}, "$ref": "#/$defs/n"}, smol_info, cache=False)
    assert _accepts(g, b'{"child":{"child":{}}}') and not _accepts(g, b'{"child":1}')


def test_merged_properties_come_in_the_order_data_takes(smol_info):
    """Properties are generated in one order, so the merge fixes it: a schema's own properties before
    those of its ``allOf`` branches (as llguidance orders them), and a branch of a union inside the
    ``allOf`` in the union's place. MaskBench's valid instances follow that order and were rejected."""
    base = {"properties": {"level": {"type": "string"}, "name": {"type": "string"}}}
    own = {"type": "object", "properties": {"spacing": {"type": "integer"}}, "allOf": [base]}
    g = compile_json_schema(own, smol_info, cache=False)
    assert _accepts(g, b'{"spacing":1,"level":"warn","name":"x"}')
    assert not _accepts(g, b'{"level":"warn","spacing":1}')
    union = {
        "allOf": [
            {
                "oneOf": [
                    {
                        "properties": {"state": {"const": "on"}, "n": {"type": "integer"}},
                        "required": ["state"],
                    },
                    {"properties": {"state": {"const": "off"}}, "required": ["state"]},
                ]
            },
            {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
        ]
    }
    g = compile_json_schema(union, smol_info, cache=False)
    assert _accepts(g, b'{"state":"on","n":2,"id":1}') and _accepts(g, b'{"state":"off","id":1}')
    assert not _accepts(g, b'{"id":1,"state":"off"}')


def test_unresolvable_ref_names_it(smol_info):
    with pytest.raises(GrammarError, match="does not resolve"):
        compile_json_schema({"properties": {"a": {"$ref": "#/$defs/missing"}}}, smol_info, cache=False)


def test_oneof_must_be_provably_disjoint(smol_info):
    with pytest.raises(GrammarError, match="oneOf at #"):
        compile_json_schema({"oneOf": [{"type": "integer"}, {"type": "number"}]}, smol_info, cache=False)
    compile_json_schema({"oneOf": [{"type": "integer"}, {"type": "string"}]}, smol_info, cache=False)
    with pytest.raises(GrammarError, match="oneOf at #"):  # [] is valid under both
        compile_json_schema(
            {"oneOf": [{"type": "array"}, {"type": "array", "maxItems": 0}]}, smol_info, cache=False
        )


@pytest.mark.parametrize(
    "schema",
    [
        {"oneOf": [{"type": "array", "maxItems": 0}, {"type": "array", "minItems": 1}]},
        {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "string", "minLength": 3}]},
        {"oneOf": [{"required": ["a", "b"], "properties": {"a": {}, "b": {}}}, {"maxProperties": 1}]},
    ],
)
def test_oneof_branches_apart_by_size_are_disjoint(smol_info, schema):
    g = compile_json_schema(schema, smol_info, cache=False)
    for value in ([], [1, 2], "ab", "abc", {"a": 1, "b": 2}, {"a": 1}):
        text = json.dumps(value, separators=(",", ":"))
        ok = jsonschema.Draft202012Validator(schema).is_valid(value)
        assert _accepts(g, text.encode()) == ok, text


def test_overlapping_object_branches_compile_with_the_general_parser(smol_info, smol_tokenizer):
    schema = {
        "anyOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                "required": ["a"],
            },
        ]
    }
    g = compile_json_schema(schema, smol_info, cache=False)
    assert g.stats()["conflicts"] > 0  # not LALR(1): the parse forks until the branches differ
    for doc in ('{"a":1}', '{"a":1,"b":"x"}'):
        assert first_rejection(g, smol_tokenizer.encode(doc)) is None
    for doc in ('{"b":"x"}', '{"a":1,"b":2}', '{"a":1,"c":1}'):
        assert first_rejection(g, smol_tokenizer.encode(doc)) is not None
    arrays = {
        "anyOf": [
            {"type": "array", "items": {"type": "integer"}},
            {"type": "array", "items": {"type": "number"}},
        ]
    }
    forked = compile_json_schema(arrays, smol_info, cache=False)
    most = 1
    for grammar, doc in ((g, '{"a":1,"b":"x"}'), (forked, "[1,2.5,3]"), (forked, "[1,2,3]")):
        m = grammar.matcher()
        for tid in smol_tokenizer.encode(doc):
            assert np.array_equal(m.allowed().numpy(), brute_mask(m, smol_info))
            m.advance(tid)
            most = max(most, len(m.configs))
        assert m.is_accepting()
    assert most > 1  # "[1,2" is an array of integers and of numbers: two parses, one mask


def test_properties_follow_schema_order(smol_info, smol_tokenizer):
    g = compile_json_schema(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
        smol_info,
    )
    assert first_rejection(g, smol_tokenizer.encode('{"a": 1, "b": 2}')) is None
    assert first_rejection(g, smol_tokenizer.encode('{"b": 2, "a": 1}')) is not None


def test_no_schema_means_any_object(smol_info, smol_tokenizer):
    g = compile_json_schema(None, smol_info)
    assert first_rejection(g, smol_tokenizer.encode('{"x": [1, {"y": null}]}')) is None
    assert first_rejection(g, smol_tokenizer.encode("[1]")) is not None


def test_schema_as_json_text_and_caching(smol_info):
    text = json.dumps({"type": "integer"})
    assert compile_json_schema(text, smol_info) is compile_json_schema({"type": "integer"}, smol_info)


def test_generated_grammar_is_plain_lark(smol_info):
    import lark

    text = json_schema_to_lark(
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}
    )
    parser = lark.Lark(text, parser="lalr")
    parser.parse('{"n": 150}')
    with pytest.raises(lark.exceptions.LarkError):
        parser.parse('{"n": 0}')


def test_an_object_that_declares_nothing_takes_any_members(smol_info, smol_tokenizer):
    g = compile_json_schema(
        {"type": "object", "properties": {"meta": {"type": "object"}}}, smol_info, cache=False
    )
    assert first_rejection(g, smol_tokenizer.encode('{"meta":{"a":[1,{"b":null}],"c":"d"}}')) is None
    assert first_rejection(g, smol_tokenizer.encode('{"meta":{},"other":1}')) is not None  # declared: closed


@pytest.mark.parametrize(
    ("reading", "extra_ok", "nested_ok"),
    [("auto", False, True), ("true", True, True), ("false", False, False)],
)
def test_the_readings_of_an_absent_additional_properties(
    smol_info, smol_tokenizer, reading, extra_ok, nested_ok
):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "m": {"type": "object"}}}
    g = compile_json_schema(schema, smol_info, cache=False, additional_properties=reading)
    assert (first_rejection(g, smol_tokenizer.encode('{"a":1,"z":2}')) is None) == extra_ok
    assert (first_rejection(g, smol_tokenizer.encode('{"m":{"k":1}}')) is None) == nested_ok
    with pytest.raises(GrammarError, match="additional_properties"):
        compile_json_schema(schema, smol_info, cache=False, additional_properties="maybe")


def _members(keys, values, most):
    """Every object text of up to ``most`` members over ``keys`` x ``values``, duplicate keys included."""
    pairs = [(k, v) for k in keys for v in values]
    for n in range(most + 1):
        for seq in itertools.product(pairs, repeat=n):
            text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in seq) + "}"
            yield text, seq


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "integer"}},
            "required": ["a"],
            "additionalProperties": {"type": "boolean"},
        },
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "integer"}},
            "minProperties": 2,
            "maxProperties": 3,
            "additionalProperties": {"type": "boolean"},
            "oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}],
        },
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "patternProperties": {"^z": {"type": "boolean"}},
        },
    ],
    ids=["extras", "bounds-and-oneof", "pattern-properties"],
)
def test_any_order_accepts_exactly_the_valid_objects(smol_info, schema):
    """``property_order="any"``: every member sequence of up to four members is accepted iff its keys are
    distinct and the object validates (jsonschema is the oracle; order is free, a declared name at most
    once). An extra key written twice is out of scope: no grammar here tracks the set of extra keys."""
    g = compile_json_schema(
        schema, smol_info, cache=False, additional_properties="true", property_order="any"
    )
    validator = _validator(schema)
    accepted = 0
    for text, seq in _members(["a", "b", "c", "z"], [1, "s", True], 4):
        keys = [k for k, _ in seq]
        if any(keys.count(k) > 1 for k in keys if k not in schema["properties"]):
            continue
        valid = len(set(keys)) == len(keys) and validator.is_valid(dict(seq))
        assert _accepts(g, text.encode()) == valid, text
        accepted += valid
    assert accepted >= 10  # the oracle is not vacuous


def test_any_order_keeps_the_schema_order_past_its_bound(smol_info):
    """~2**n parser states per object: past ANY_ORDER_MAX declared names, a schema's ANY_ORDER_STATES, or
    the parser's state limit, members come in the schema's order (a subset of the valid objects: sound)."""
    from radixchat.grammar.schema.json_objects import ANY_ORDER_MAX, ANY_ORDER_STATES, _any_order_cost

    def obj(n, low=0):
        return {
            "type": "object",
            "properties": {f"p{i}": {"type": "integer", "minimum": low} for i in range(n)},
        }

    small, big = obj(ANY_ORDER_MAX), obj(ANY_ORDER_MAX + 1)
    swapped = b'{"p1":1,"p0":0}'
    assert _accepts(compile_json_schema(small, smol_info, cache=False, property_order="any"), swapped)
    g = compile_json_schema(big, smol_info, cache=False, property_order="any")
    assert not _accepts(g, swapped) and _accepts(g, b'{"p0":0,"p1":1}')
    many = ANY_ORDER_STATES // _any_order_cost(ANY_ORDER_MAX, 1, None, False) + 1  # the last: past the budget
    schema = {"type": "array", "prefixItems": [obj(ANY_ORDER_MAX, -k) for k in range(many)], "items": False}
    g = compile_json_schema(schema, smol_info, cache=False, property_order="any")
    items = ["{}"] * many
    assert _accepts(g, ("[" + ",".join(items[:-1] + [swapped.decode()]) + "]").encode()) is False
    assert _accepts(g, ("[" + ",".join([swapped.decode()] + items[1:]) + "]").encode())
    # maxProperties: counted where its rules stay few (each name once: the count is the names'), else
    # the schema's order; neither is refused (this bound raised "too large to unroll" under any order).
    g = compile_json_schema({**small, "maxProperties": 100}, smol_info, cache=False, property_order="any")
    assert _accepts(g, swapped)
    wide = {**small, "maxProperties": 100, "additionalProperties": True}  # extra members: 100 counts each
    g = compile_json_schema(wide, smol_info, cache=False, property_order="any")
    assert not _accepts(g, swapped) and _accepts(g, b'{"p0":0,"p1":1,"zz":2}')
    # A schema its any-order rules would push past the parser's state limit compiles in the schema's order.
    g = compile_json_schema(small, smol_info, cache=False, property_order="any", max_states=500)
    assert not _accepts(g, swapped) and _accepts(g, b'{"p0":0,"p1":1}')
    with pytest.raises(GrammarError, match="LALR states"):
        compile_json_schema(small, smol_info, cache=False, max_states=20)
    with pytest.raises(GrammarError, match="property_order"):
        compile_json_schema(small, smol_info, cache=False, property_order="sorted")


@pytest.mark.parametrize("order", ["schema", "any"])
def test_open_object_keys_lex_as_one_family_with_the_same_masks(smol_info, smol_tokenizer, order):
    """Where an extra key may come, the masks lex every declared name of the object (one lexer state
    per object, not one per position) and drop the tokens only names the parser does not take keep
    alive: the masks equal those of the same grammar lexed per position."""
    names = ["ab", "abc", "b", "bcd", "c", "ca"]
    schema = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": ["c"]}
    g = compile_json_schema(
        schema, smol_info, cache=False, additional_properties="true", property_order=order
    )
    assert g._families
    plain = CompiledGrammar(g.text, smol_info, glr=True)  # the same grammar without families
    rng = random.Random(order)
    docs = [
        '{"ab":1,"b":2,"zz":3,"c":4}',
        '{"abc":1,"c":2}',
        '{"c":1,"abx":2,"ca":3}',
        '{"b":2,"ab":1,"c":3}',
    ]
    docs.append('{"ab":1,"c":2,"ab":3}')  # a name twice: the second is one dropped in both orders
    walks = [smol_tokenizer.encode(d, add_special_tokens=False) for d in docs] + [None] * 12
    for ids in walks:
        m, p = g.matcher(), plain.matcher()
        for k in range(len(ids) if ids else 40):
            mask = m.allowed().numpy()
            assert np.array_equal(mask, p.allowed().numpy())
            tid = ids[k] if ids else rng.choice(np.flatnonzero(mask).tolist())
            if not mask[tid] or tid in smol_info.eos_ids:
                assert not p.can_advance(tid) or tid in smol_info.eos_ids
                break
            m.advance(tid)
            p.advance(tid)
    for doc in docs:  # every prefix and whole text, byte by byte (feed)
        for k in range(1, len(doc) + 1):
            assert _live(g, doc[:k].encode()) == _live(plain, doc[:k].encode()), doc[:k]
        assert _accepts(g, doc.encode()) == _accepts(plain, doc.encode())


def _live(g, text: bytes) -> bool:
    try:
        g.matcher().advance_bytes(text)
    except GrammarError:
        return False
    return True


def test_oneof_of_required_sets_enforces_exactly_one(smol_info, smol_tokenizer):
    """The common "either a, or b and c" pattern: branches differ only in what they require."""
    props = {k: {"type": "integer"} for k in ("a", "b", "c")}
    schema = {"type": "object", "properties": props, "oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}]}
    g = compile_json_schema(schema, smol_info, cache=False)
    for doc in ({"a": 1}, {"a": 1, "b": 2}, {"b": 2, "c": 3}):
        jsonschema.validate(doc, schema)
        assert first_rejection(g, smol_tokenizer.encode(json.dumps(doc, separators=(",", ":")))) is None
    for doc in ({"a": 1, "b": 2, "c": 3}, {"b": 2}, {}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)
        assert first_rejection(g, smol_tokenizer.encode(json.dumps(doc, separators=(",", ":")))) is not None


def test_oneof_branches_told_apart_by_a_shared_required_property_keep_their_values(smol_info, smol_tokenizer):
    """Branches that only narrow the parent's properties (MaskBench Github_medium---o48619): each merged
    branch's ``connType`` is ``allOf`` [string, enum], which must be merged to see that the enums are
    disjoint. Before, the branches were "narrowed" never to hold all the properties the other requires,
    which both require themselves: no value at all, so only ``[]`` fitted an array of them."""
    schema = {
        "type": "array",
        "items": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"connType": {"type": "string"}, "id": {"type": "integer"}, "relation": {}},
            "required": ["id", "connType"],
            "oneOf": [
                {"properties": {"connType": {"enum": ["relative"]}, "relation": {"type": "string"}}},
                {"properties": {"connType": {"enum": ["friend", "other"]}, "relation": {"type": "boolean"}}},
            ],
        },
    }
    g = compile_json_schema(schema, smol_info, cache=False)
    valid = [
        {"connType": "friend", "id": 1, "relation": True},
        {"connType": "relative", "id": 2, "relation": "x"},
    ]
    invalid = [{"connType": "friend", "id": 1, "relation": "x"}], [{"connType": "enemy", "id": 1}]
    jsonschema.validate(valid, schema)
    assert first_rejection(g, smol_tokenizer.encode(json.dumps(valid, separators=(",", ":")))) is None
    for doc in invalid:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema)
        assert first_rejection(g, smol_tokenizer.encode(json.dumps(doc, separators=(",", ":")))) is not None


def test_an_unknown_format_without_a_type_does_not_make_a_string(smol_info, smol_tokenizer):
    """``format`` is an annotation unless we know it: ``{"format": "positiveInteger"}`` takes any value
    (MaskBench Github_medium---o63383 wrote 2 there); a known format still reads as a string."""
    g = compile_json_schema({"format": "positiveInteger"}, smol_info, cache=False)
    for doc in ("2", '"two"', "[1]"):
        assert first_rejection(g, smol_tokenizer.encode(doc)) is None, doc
    g = compile_json_schema({"format": "date"}, smol_info, cache=False)
    assert first_rejection(g, smol_tokenizer.encode('"2024-01-31"')) is None
    assert first_rejection(g, smol_tokenizer.encode("2")) is not None


def test_oneof_branches_with_disjoint_enums_or_forbidden_properties_compile(smol_info):
    compile_json_schema(
        {"oneOf": [{"type": "string", "enum": ["a", "b"]}, {"type": "string", "enum": ["c"]}]},
        smol_info,
        cache=False,
    )
    closed = {
        "type": "object",
        "properties": {"x": {"type": "string"}},
        "required": ["x"],
        "additionalProperties": False,
    }
    other = {
        "type": "object",
        "properties": {"y": {"type": "string"}},
        "required": ["y"],
        "additionalProperties": False,
    }
    compile_json_schema({"oneOf": [closed, other]}, smol_info, cache=False)


def test_lenient_lists_the_keywords_it_does_not_enforce(smol_info):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GrammarWarning)
        g = compile_json_schema(schema, smol_info, lenient=True, cache=False)
    assert g.not_enforced == ("unsupported keyword 'uniqueItems' at #/uniqueItems",)
    assert compile_json_schema({"type": "array"}, smol_info, cache=False).not_enforced == ()


def test_a_huge_max_length_is_exact(smol_info, smol_tokenizer):
    """Lengths are counted (grammar.counted), not unrolled: a long maxLength holds exactly."""
    g = compile_json_schema({"type": "string", "maxLength": 3000}, smol_info, cache=False)
    assert first_rejection(g, smol_tokenizer.encode(json.dumps("a" * 3000))) is None
    assert first_rejection(g, smol_tokenizer.encode(json.dumps("a" * 3001))) is not None


def test_a_huge_max_length_next_to_a_pattern_compiles_as_a_narrower_bound(smol_info, smol_tokenizer):
    """A length checked next to a pattern is a product DFA (a copy of the pattern per count): maxLength
    32767 is generated as MAX_STRING_BOUND (valid values only)."""
    from radixchat.grammar.schema.json_schema import MAX_STRING_BOUND

    g = compile_json_schema({"type": "string", "pattern": "^a", "maxLength": 32767}, smol_info, cache=False)
    assert first_rejection(g, smol_tokenizer.encode(json.dumps("a" * MAX_STRING_BOUND))) is None
    assert first_rejection(g, smol_tokenizer.encode(json.dumps("a" * (MAX_STRING_BOUND + 1)))) is not None
