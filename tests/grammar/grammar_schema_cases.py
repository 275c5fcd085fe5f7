"""A corpus of schemas with valid and invalid instances.

The official JSON-Schema-Test-Suite is not installable here (no Python package ships it), so these
cases are our own, grouped by the suite's categories for the keywords we support. Valid instances
list properties in schema order (our documented ordering) and validate with ``jsonschema``.
``invalid`` instances must be rejected by the grammar: most are invalid JSON Schema instances, a few
are rejected by our documented policy (``additionalProperties`` defaults to false).
"""

from __future__ import annotations

CASES: list[dict] = [
    # type
    {
        "name": "type/integer",
        "schema": {"type": "integer"},
        "valid": [0, -7, 12345678901234567890],
        "invalid": [1.5, "1", None],
    },
    {
        "name": "type/number",
        "schema": {"type": "number"},
        "valid": [0, -1.25, 3e-7, 1e100],
        "invalid": ["x", True],
    },
    {
        "name": "type/string",
        "schema": {"type": "string"},
        "valid": ["", 'a"b\\c\n\u0001', "ünï 😀"],
        "invalid": [1, None],
    },
    {
        "name": "type/boolean-null",
        "schema": {"type": ["boolean", "null"]},
        "valid": [True, False, None],
        "invalid": [0, "true"],
    },
    {
        "name": "type/array-of-types",
        "schema": {"type": ["integer", "string"]},
        "valid": [3, "x"],
        "invalid": [1.5, [], {}],
    },
    # properties / required / additionalProperties
    {
        "name": "properties/basic",
        "schema": {"type": "object", "properties": {"foo": {"type": "integer"}, "bar": {"type": "string"}}},
        "valid": [{}, {"foo": 1}, {"bar": "x"}, {"foo": 1, "bar": "x"}],
        "invalid": [{"foo": "1"}, {"bar": 2}, {"baz": 1}],
    },
    {
        "name": "required/basic",
        "schema": {
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}},
            "required": ["b"],
        },
        "valid": [{"b": 1}, {"a": "", "b": 0}],
        "invalid": [{}, {"a": "x"}],
    },
    {
        "name": "additionalProperties/schema",
        "schema": {
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "additionalProperties": {"type": "boolean"},
        },
        "valid": [{"id": 1, "x": True, "y": False}, {"z": True}],
        "invalid": [{"id": 1, "x": 1}, {"id": "a"}],
    },
    {
        "name": "additionalProperties/true",
        "schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": True},
        "valid": [{"id": 1, "x": [1, {"y": None}]}],
        "invalid": [{"id": True}],
    },
    {
        "name": "additionalProperties/default-false",
        "schema": {"type": "object", "properties": {"id": {"type": "integer"}}},
        "valid": [{"id": 1}],
        "invalid": [{"id": 1, "extra": 2}],
    },
    # patternProperties / propertyNames / min/maxProperties
    {
        "name": "patternProperties",
        "schema": {
            "type": "object",
            "patternProperties": {"^s_": {"type": "string"}, "^n_": {"type": "number"}},
        },
        "valid": [{"s_a": "x", "n_b": 2}, {}],
        "invalid": [{"s_a": 1}, {"x": 1}],
    },
    {
        "name": "propertyNames",
        "schema": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "propertyNames": {"maxLength": 3},
        },
        "valid": [{"abc": 1, "d": 2}],
        "invalid": [{"abcd": 1}],
    },
    {
        "name": "minProperties-maxProperties",
        "schema": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "minProperties": 1,
            "maxProperties": 2,
        },
        "valid": [{"a": 1}, {"a": 1, "b": 2}],
        "invalid": [{}, {"a": 1, "b": 2, "c": 3}],
    },
    # items / prefixItems / minItems / maxItems
    {
        "name": "items/schema",
        "schema": {"type": "array", "items": {"type": "integer"}},
        "valid": [[], [1, 2, 3]],
        "invalid": [[1, "2"], {}],
    },
    {
        "name": "prefixItems",
        "schema": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
        "valid": [[], [1], [1, "a"]],
        "invalid": [[1, "a", 2], ["a"]],
    },
    {
        "name": "prefixItems/rest",
        "schema": {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "boolean"}},
        "valid": [["x", True, False]],
        "invalid": [["x", 1]],
    },
    {
        "name": "minItems-maxItems",
        "schema": {"type": "array", "minItems": 2, "maxItems": 3},
        "valid": [[1, "a"], [None, {}, []]],
        "invalid": [[1], [1, 2, 3, 4]],
    },
    # enum / const
    {
        "name": "enum/mixed",
        "schema": {"enum": [1, "two", None, True, [3], {"four": 4}]},
        "valid": [1, "two", None, True, [3], {"four": 4}],
        "invalid": [2, "three", False, [4], {"four": 5}],
    },
    {
        "name": "enum/unicode",
        "schema": {"enum": ["café", "日本", 'a"q']},
        "valid": ["café", "日本", 'a"q'],
        "invalid": ["cafe"],
    },
    {"name": "const", "schema": {"const": {"a": [1, 2]}}, "valid": [{"a": [1, 2]}], "invalid": [{"a": [1]}]},
    # anyOf / oneOf / allOf
    {
        "name": "anyOf/scalars",
        "schema": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 10}]},
        "valid": ["ab", 10, 99],
        "invalid": ["abc", 9],
    },
    {
        "name": "anyOf/objects-discriminated",
        "schema": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
                    "required": ["kind"],
                },
                {
                    "type": "object",
                    "properties": {"kind": {"const": "b"}, "y": {"type": "string"}},
                    "required": ["kind"],
                },
            ]
        },
        "valid": [{"kind": "a", "x": 1}, {"kind": "b", "y": "s"}],
        "invalid": [{"kind": "a", "y": "s"}, {"kind": "c"}],
    },
    {
        "name": "anyOf/empty-shared",
        "schema": {
            "anyOf": [
                {"type": "object", "properties": {"a": {"type": "integer"}}},
                {"type": "object", "properties": {"b": {"type": "string"}}},
            ]
        },
        "valid": [{}, {"a": 1}, {"b": "x"}],
        "invalid": [{"a": "x"}],
    },
    {
        "name": "oneOf/disjoint-types",
        "schema": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "null"}}]},
        "valid": ["x", [None]],
        "invalid": [1, [1]],
    },
    {
        "name": "allOf/merge",
        "schema": {
            "allOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"properties": {"b": {"type": "integer", "minimum": 5}}, "required": ["b"]},
            ]
        },
        "valid": [{"a": "x", "b": 5}],
        "invalid": [{"a": "x"}, {"a": "x", "b": 4}],
    },
    {
        "name": "allOf/with-anyOf",
        "schema": {"allOf": [{"type": "integer"}, {"anyOf": [{"minimum": 100}, {"maximum": -100}]}]},
        "valid": [100, -100, 5000],
        "invalid": [0, 99],
    },
    # $ref / $defs / definitions / recursion / boolean schemas
    {
        "name": "ref/defs",
        "schema": {
            "$defs": {"pos": {"type": "integer", "minimum": 1}},
            "type": "array",
            "items": {"$ref": "#/$defs/pos"},
        },
        "valid": [[1, 2]],
        "invalid": [[0]],
    },
    {
        "name": "ref/definitions",
        "schema": {
            "definitions": {"s": {"type": "string"}},
            "type": "object",
            "properties": {"x": {"$ref": "#/definitions/s"}},
        },
        "valid": [{"x": "a"}],
        "invalid": [{"x": 1}],
    },
    {
        "name": "ref/recursive",
        "schema": {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "v": {"type": "integer"},
                        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "required": ["v"],
                }
            },
            "$ref": "#/$defs/node",
        },
        "valid": [{"v": 1}, {"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]}],
        "invalid": [{"v": 1, "kids": [{}]}],
    },
    {
        "name": "ref/root-recursive",
        "schema": {"type": ["array", "integer"], "items": {"$ref": "#"}},
        "valid": [1, [1, [2, []]]],
        "invalid": [[1, "a"]],
    },
    {"name": "boolean-schema/true", "schema": True, "valid": [1, "x", {"a": [None]}], "invalid": []},
    {
        "name": "boolean-schema/in-properties",
        "schema": {"type": "object", "properties": {"any": True, "never": False}},
        "valid": [{"any": [1]}, {}],
        "invalid": [{"never": 1}],
    },
    # strings
    {
        "name": "minLength-maxLength",
        "schema": {"type": "string", "minLength": 2, "maxLength": 3},
        "valid": ["ab", "abc", "😀é", "\n\t"],
        "invalid": ["a", "abcd"],
    },
    {
        "name": "pattern/anchored",
        "schema": {"type": "string", "pattern": "^[a-z]+-[0-9]{2,3}$"},
        "valid": ["ab-12", "x-999"],
        "invalid": ["ab12", "AB-12", "ab-1"],
    },
    {
        "name": "pattern/unanchored",
        "schema": {"type": "string", "pattern": "o+b"},
        "valid": ["foob", "oob", "xob!"],
        "invalid": ["fb", "bo"],
    },
    # numbers
    {
        "name": "integer-bounds",
        "schema": {"type": "integer", "minimum": -5, "exclusiveMaximum": 150},
        "valid": [-5, 0, 149],
        "invalid": [-6, 150, 1000],
    },
    {
        "name": "number-bounds",
        "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5},
        "valid": [0.001, 1, 2.5, 2.25],
        "invalid": [0, -1, 2.51, 3],
    },
    # formats
    {
        "name": "format/date",
        "schema": {"type": "string", "format": "date"},
        "valid": ["2024-02-29", "1999-12-31"],
        "invalid": ["2023-02-29", "2024-13-01", "24-01-01"],
    },
    {
        "name": "format/date-time",
        "schema": {"type": "string", "format": "date-time"},
        "valid": ["2024-05-06T07:08:09Z", "2024-05-06T07:08:09.123+02:00"],
        "invalid": ["2024-05-06 07:08"],
    },
    {
        "name": "format/time",
        "schema": {"type": "string", "format": "time"},
        "valid": ["23:59:60Z", "01:02:03.5-05:00"],
        "invalid": ["24:00:00Z"],
    },
    {
        "name": "format/uuid",
        "schema": {"type": "string", "format": "uuid"},
        "valid": ["123e4567-e89b-12d3-a456-426614174000"],
        "invalid": ["123e4567e89b12d3a456426614174000"],
    },
    {
        "name": "format/email",
        "schema": {"type": "string", "format": "email"},
        "valid": ["a.b+c@example.com"],
        "invalid": ["nobody"],
    },
    {
        "name": "format/ipv4",
        "schema": {"type": "string", "format": "ipv4"},
        "valid": ["192.168.0.1", "0.0.0.0"],
        "invalid": ["256.1.1.1", "1.2.3"],
    },
    {
        "name": "format/ipv6",
        "schema": {"type": "string", "format": "ipv6"},
        "valid": ["::1", "2001:db8::8a2e:370:7334", "::ffff:10.0.0.1"],
        "invalid": ["1:2:3", "12345::"],
    },
    {
        "name": "format/hostname",
        "schema": {"type": "string", "format": "hostname"},
        "valid": ["a-b.example.org"],
        "invalid": ["-bad.example"],
    },
    {
        "name": "format/uri",
        "schema": {"type": "string", "format": "uri"},
        "valid": ["https://example.com/a?b=c#d", "urn:isbn:123"],
        "invalid": ["no scheme"],
    },
    # a realistic nested schema
    {
        "name": "nested/order",
        "schema": {
            "type": "object",
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "customer": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "email": {"type": "string", "format": "email"},
                    },
                    "required": ["name"],
                },
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{4}$"},
                            "qty": {"type": "integer", "minimum": 1},
                            "price": {"type": "number", "minimum": 0},
                        },
                        "required": ["sku", "qty"],
                    },
                },
                "status": {"enum": ["new", "paid", "shipped"]},
                "note": {"type": ["string", "null"]},
            },
            "required": ["id", "items", "status"],
        },
        "valid": [
            {
                "id": "123e4567-e89b-12d3-a456-426614174000",
                "items": [{"sku": "ABC1234", "qty": 2, "price": 9.5}],
                "status": "paid",
                "note": None,
            },
            {
                "id": "123e4567-e89b-12d3-a456-426614174000",
                "customer": {"name": "Zoë", "email": "z@x.io"},
                "items": [{"sku": "XYZ0001", "qty": 1}],
                "status": "new",
            },
        ],
        "invalid": [
            {"id": "123e4567-e89b-12d3-a456-426614174000", "items": [], "status": "new"},
            {
                "id": "123e4567-e89b-12d3-a456-426614174000",
                "items": [{"sku": "ab", "qty": 1}],
                "status": "new",
            },
        ],
    },
]
