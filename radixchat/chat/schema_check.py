"""The final check of a JSON-mode reply against its schema, with JSON Schema's own validator.

The grammar guarantees a strict schema as the reply is generated; in lenient mode it enforces what it
can and leaves keywords such as ``uniqueItems``, ``not`` or ``if``/``then``/``else`` to this check, whose
findings front ends show (batch: ``"schema_errors"``). Torch-free: the chat app may import it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_ERRORS = 20

#: Keywords the grammar cannot enforce (``radixchat.grammar.schema.json_schema.UNSUPPORTED``; a test
#: keeps the two equal: the grammar package imports torch, this module must not).
UNENFORCED = frozenset(
    {
        "uniqueItems", "contains", "minContains", "maxContains", "not", "if", "then", "else",
        "dependencies", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
        "unevaluatedItems", "$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor",
        "multipleOf",
    }
)  # fmt: skip
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "items", "additionalItems", "propertyNames", "not", "if", "then",
               "else", "contains", "unevaluatedProperties", "unevaluatedItems")  # fmt: skip
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")


def unenforced_keywords(schema: Any, path: str = "#") -> list[str]:
    """Where ``schema`` uses keywords the grammar cannot enforce: ``["uniqueItems at #/tags", ...]``
    (what lenient mode leaves to ``schema_errors``; a ``oneOf`` that may overlap shows only when compiled)."""
    out: list[str] = []
    if not isinstance(schema, dict):
        return out
    listed = "enum" in schema or "const" in schema  # the grammar filters a list by every keyword beside it
    for kw in schema:
        if kw in UNENFORCED and not (kw == "multipleOf" and schema[kw] == 1) and not listed:
            out.append(f"{kw} at {path}")
    for kw in _SCHEMA_MAPS:
        if isinstance(schema.get(kw), dict):
            for name, sub in schema[kw].items():
                out += unenforced_keywords(sub, f"{path}/{kw}/{name}")
    for kw in _SCHEMA_ONE:
        if isinstance(schema.get(kw), dict):
            out += unenforced_keywords(schema[kw], f"{path}/{kw}")
    for kw in _SCHEMA_LISTS:
        if isinstance(schema.get(kw), list):
            for i, sub in enumerate(schema[kw]):
                out += unenforced_keywords(sub, f"{path}/{kw}/{i}")
    return out


def schema_errors(schema: Any, text: str) -> list[str]:
    """Why ``text`` fails ``schema``, one line each (``[]``: valid). ``None`` means any JSON object."""
    import jsonschema

    try:
        value = json.loads(text)
    except ValueError as exc:
        return [f"the reply is not JSON: {exc}"]
    if schema is None:
        schema = {"type": "object"}
    if isinstance(schema, str):
        schema = json.loads(schema)
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    out = []
    for err in errors[:MAX_ERRORS]:
        where = "#" + "".join(f"/{p}" for p in err.absolute_path)
        out.append(f"{where}: {err.message} ({err.validator})")
    return out
