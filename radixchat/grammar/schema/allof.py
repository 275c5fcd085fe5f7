"""``allOf`` by merging schemas into one (the usual "model inheritance" use).

Merging rules: types intersect; properties unite (a property in several branches gets the allOf of
its schemas); ``required`` unites; bounds tighten; ``enum``/``const`` intersect; patterns and formats
accumulate (all must match); ``anyOf``/``oneOf`` inside a branch distribute over the others.
``additionalProperties`` of the merged schema is the allOf of those given, applied to keys declared by
no branch (JSON Schema applies each branch's to its own declared keys; merging is the common intent).
"""

from __future__ import annotations

import itertools
import json

from ..errors import GrammarError
from .json_shape import is_annotation

_MAX = {"minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum"}
_MIN = {"maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum"}


def _types(t) -> set[str] | None:
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _intersect_types(a: set[str], b: set[str]) -> set[str]:
    out = a & b
    if "integer" in a and "number" in b or "number" in a and "integer" in b:
        out.add("integer")
    return out


def _both(a, b):
    if a is True:
        return b
    if b is True:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


def merge_all_of(schemas: list, path: str, comp) -> dict | bool:
    """Merge schemas (and their nested ``allOf``) into one schema, following local ``$ref``s."""
    flat: list = []

    def collect(s, p: str, depth: int = 0) -> None:
        if depth > 50:
            raise GrammarError(f"allOf nesting too deep at #{p}")
        s, p = comp.deref(s, p)
        if s is True:
            return
        if isinstance(s, dict) and "allOf" in s:
            # The schema's own keywords first, then its branches': the merged properties come in that
            # order (as llguidance orders them), the order data written to such schemas mostly takes.
            rest = {k: v for k, v in s.items() if k != "allOf"}
            if rest:
                collect(rest, p, depth + 1)
            for i, sub in enumerate(s["allOf"]):
                collect(sub, f"{p}/allOf/{i}", depth + 1)
            return
        flat.append(s)

    for s in schemas:
        collect(s, path)
    if any(s is False for s in flat):
        return False
    # Distribute unions: allOf[A, anyOf[B, C]] == anyOf[allOf[A, B], allOf[A, C]], each branch in the
    # union's place (which orders the merged properties).
    unions = [i for i, s in enumerate(flat) if isinstance(s, dict) and ("anyOf" in s or "oneOf" in s)]
    if unions:
        choices = []
        for i in unions:
            s = flat[i]
            kw = "anyOf" if "anyOf" in s else "oneOf"
            rest = {k: v for k, v in s.items() if k != kw}
            choices.append([{**rest, "allOf": [b]} if rest else b for b in s[kw]])
        combos = list(itertools.islice(itertools.product(*choices), 65))
        if len(combos) > 64:
            raise GrammarError(f"allOf at #{path}: too many combinations of anyOf/oneOf branches")
        out = []
        for c in combos:
            parts = list(flat)
            for i, b in zip(unions, c):
                parts[i] = b
            out.append({"allOf": parts})
        return {"anyOf": out}
    out: dict = {}
    for s in flat:
        if not isinstance(s, dict):
            raise GrammarError(f"allOf at #{path}: a branch is not a schema")
        for k, v in s.items():
            if is_annotation(k):  # branches may describe the same value differently
                continue
            if k == "const":
                k, v = "enum", [v]
            if k not in out:
                out[k] = v
                continue
            out[k] = _merge_key(k, out[k], v, path)
    return out


def _merge_key(k: str, a, b, path: str):
    if k == "type":
        t = _intersect_types(_types(a), _types(b))
        return sorted(t)
    if k in _MAX:
        return b if isinstance(a, bool) else a if isinstance(b, bool) else max(a, b)
    if k in _MIN:
        return b if isinstance(a, bool) else a if isinstance(b, bool) else min(a, b)
    if k == "required":
        return list(dict.fromkeys(list(a) + list(b)))
    if k in ("properties", "patternProperties"):
        merged = dict(a)
        for name, sub in b.items():
            merged[name] = _both(merged[name], sub) if name in merged else sub
        return merged
    if k in ("additionalProperties", "items", "propertyNames", "additionalItems"):
        return _both(a, b)
    if k == "prefixItems":
        n = max(len(a), len(b))
        return [_both(a[i] if i < len(a) else True, b[i] if i < len(b) else True) for i in range(n)]
    if k == "enum":
        keys = {json.dumps(v, sort_keys=True) for v in b}
        return [v for v in a if json.dumps(v, sort_keys=True) in keys]
    if k in ("x-radixchat-not-all", "x-radixchat-requires"):  # json_objects' presence rules: all apply
        return a + b
    if k in ("dependencies", "dependentRequired") and isinstance(a, dict) and isinstance(b, dict):
        merged = dict(a)
        for name, dep in b.items():
            old = merged.get(name)
            if old is None:
                merged[name] = dep
            elif isinstance(old, list) and isinstance(dep, list):
                merged[name] = list(dict.fromkeys(old + dep))
            else:
                merged[name] = _both(
                    {"required": old} if isinstance(old, list) else old,
                    {"required": dep} if isinstance(dep, list) else dep,
                )
        return merged
    if k in ("pattern", "format"):
        la = a if isinstance(a, list) else [a]
        lb = b if isinstance(b, list) else [b]
        return list(dict.fromkeys(la + lb))
    if a == b:
        return a
    raise GrammarError(f"allOf at #{path}: cannot merge differing '{k}' values")
