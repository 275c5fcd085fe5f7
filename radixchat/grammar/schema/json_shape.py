"""The union of JSON values a (sub)schema allows, by kind, and small type helpers."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import GrammarError

ALL_TYPES = ("object", "array", "string", "number", "boolean", "null")
# Keywords that say nothing about which values are valid.
ANNOTATIONS = {
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "id",
    "$comment",
    "readOnly",
    "writeOnly",
    "deprecated",
    "$anchor",
    "contentMediaType",
    "contentEncoding",
    "discriminator",
    "example",
    "$defs",
    "definitions",
    "externalDocs",
    "xml",
}
OWN_EXTENSIONS = ("x-grammar", "x-radixchat-")  # the ``x-`` keywords radixchat reads (prefixes)


def is_annotation(keyword: str) -> bool:
    """True for a keyword that never changes which values are valid: the annotations, and ``x-``
    extension keywords other than radixchat's own (another tool's, e.g. ``x-intellij-html-description``)."""
    return keyword in ANNOTATIONS or keyword.startswith("x-") and not keyword.startswith(OWN_EXTENSIONS)


@dataclass
class Shape:
    """The union of JSON values a (sub)schema allows, by kind."""

    any: bool = False
    strings: list = field(default_factory=list)  # JSON-text regex ASTs, one per string form
    any_string: bool = False
    grammars: list = field(default_factory=list)  # rules of strings with an ``x-grammar`` (content)
    numbers: list = field(default_factory=list)
    any_number: bool = False
    literals: set = field(default_factory=set)  # "true", "false", "null"
    objects: list = field(default_factory=list)  # nonempty object symbols
    empty_object: bool = False
    arrays: list = field(default_factory=list)
    empty_array: bool = False

    def merge(self, o: Shape) -> None:
        self.merge_all([o])

    def merge_all(self, shapes: list[Shape]) -> None:
        """Merge several shapes at once: one pass per list with a set of what it holds (merging an
        ``enum`` of thousands of values one at a time, with list scans, was quadratic)."""
        for o in shapes:
            self.any |= o.any
            self.any_string |= o.any_string
            self.any_number |= o.any_number
            self.literals |= o.literals
            self.empty_object |= o.empty_object
            self.empty_array |= o.empty_array
        for attr in ("strings", "numbers", "grammars", "objects", "arrays"):
            dst = getattr(self, attr)
            seen = None
            for o in shapes:
                src = getattr(o, attr)
                if not src:
                    continue
                if seen is None:
                    seen = set(dst)
                for a in src:
                    if a not in seen:
                        seen.add(a)
                        dst.append(a)

    def kinds(self) -> set[str]:
        out = set()
        if self.any:
            return set(ALL_TYPES)
        if self.strings or self.any_string or self.grammars:
            out.add("string")
        if self.numbers or self.any_number:
            out.add("number")
        if self.literals - {"null"}:
            out.add("boolean")
        if "null" in self.literals:
            out.add("null")
        if self.objects or self.empty_object:
            out.add("object")
        if self.arrays or self.empty_array:
            out.add("array")
        return out


def type_of(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    raise GrammarError(f"not a JSON value: {v!r}")


def schema_types(schema: dict, path: str) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    ts = [t] if isinstance(t, str) else t
    if not isinstance(ts, list) or not all(isinstance(x, str) for x in ts):
        raise GrammarError(f"type at #{path}/type must be a string or an array of strings")
    bad = set(ts) - set(ALL_TYPES) - {"integer"}
    if bad:
        raise GrammarError(f"unknown type {sorted(bad)[0]!r} at #{path}/type")
    return set(ts)


def _canonical(v):
    """Equal JSON values compare equal: 1 and 1.0 are one number (JSON Schema's equality)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, dict):
        return {k: _canonical(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_canonical(x) for x in v]
    return v


def const_values(s) -> set | None:
    if isinstance(s, dict):
        if "const" in s:
            return {json.dumps(_canonical(s["const"]), sort_keys=True)}
        if "enum" in s and isinstance(s["enum"], list):
            return {json.dumps(_canonical(v), sort_keys=True) for v in s["enum"]}
    return None
