"""JSON Schema -> Lark grammar text (then compiled like any grammar).

Semantics, on purpose narrower than JSON Schema where generation needs it (documented in
docs/grammar.md):
- properties are emitted in schema order (required ones must appear, optional ones may be skipped);
  extra keys (``additionalProperties``/``patternProperties``) come after the declared ones;
- ``additionalProperties`` defaults to false; ``items`` defaults to any value;
- without ``type``, the type is inferred from the keywords present (``properties`` -> object, ...);
- integers are written without fraction or exponent, bounded numbers without exponent.
Every union (type arrays, ``anyOf``, provably disjoint ``oneOf``) must be decidable left to right
(LALR(1)): strings and numbers of all branches merge into one terminal each, the empty ``{}``/``[]``
is factored out, and object/array branches must differ by some key or value before they end.
"""

from __future__ import annotations

import json
import warnings
from collections import OrderedDict
from decimal import Decimal

from .. import regex as rx
from ..compiler import CompiledGrammar
from ..errors import GrammarError
from . import json_terminals as jt
from .allof import merge_all_of
from .json_objects import array_shape, literal_structure, object_shape
from .json_shape import ALL_TYPES, Shape, const_values, schema_types, type_of
from .lark_text import LarkWriter

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
UNSUPPORTED = {
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "not",
    "if",
    "then",
    "else",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "$dynamicRef",
    "$recursiveRef",
    "$dynamicAnchor",
    "$recursiveAnchor",
    "multipleOf",
}
OBJECT_KW = {
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
}
ARRAY_KW = {"items", "prefixItems", "additionalItems", "minItems", "maxItems"}
STRING_KW = {"minLength", "maxLength", "pattern", "format"}
NUMBER_KW = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


class GrammarWarning(UserWarning):
    """An unsupported schema feature was ignored (``lenient=True``)."""


def _declared_kinds(schema, path: str) -> set[str] | None:
    """The kinds a schema allows, from ``type`` or its keywords alone (None: cannot tell cheaply)."""
    if not isinstance(schema, dict) or set(schema) & {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"}:
        return None
    types = schema_types(schema, path)
    if types is not None:
        return set(types)
    present = set(schema)
    kinds = {k for k, kws in (("object", OBJECT_KW), ("array", ARRAY_KW)) if present & kws}
    return kinds if kinds and not present & (STRING_KW | NUMBER_KW) else None


def _ptr(path: str) -> str:
    return "#" + path


class SchemaCompiler:
    """Builds the Lark text for one root schema. ``lenient`` turns unsupported keywords into warnings."""

    def __init__(self, root, lenient: bool = False) -> None:
        self.root = root
        self.lenient = lenient
        self.w = LarkWriter()
        self._memo: dict[str, str | None] = {}
        self._ref_rules: dict[str, str] = {}
        self._resolving: set[str] = set()
        self.pairs: dict[tuple[str, str], str] = {}

    # -- entry point ------------------------------------------------------------------------------------

    def lark(self) -> str:
        sym = self.symbol(self.root, "")
        if sym is None:
            raise GrammarError("schema at # accepts no value")
        return self.w.text(sym)

    # -- helpers ----------------------------------------------------------------------------------------

    def fail(self, msg: str) -> None:
        if self.lenient:
            warnings.warn(msg + " (ignored: lenient)", GrammarWarning, stacklevel=4)
        else:
            raise GrammarError(msg)

    def resolve(self, ref: str, path: str):
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise GrammarError(f"remote $ref {ref!r} at {_ptr(path)}: only local references are supported")
        if ref != "#" and not ref.startswith("#/"):
            raise GrammarError(f"$ref {ref!r} at {_ptr(path)}: anchors are not supported, use a JSON pointer")
        node = self.root
        parts = ref[1:].split("/")[1:] if ref != "#" else []
        for raw in parts:
            key = raw.replace("%25", "%").replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            elif isinstance(node, dict) and key in node:
                node = node[key]
            else:
                raise GrammarError(f"$ref {ref!r} at {_ptr(path)} does not resolve")
        return node, ref[1:]

    def deref(self, schema, path: str, depth: int = 0):
        """Follow a bare ``$ref`` chain (for merging); recursion through allOf is rejected."""
        while isinstance(schema, dict) and "$ref" in schema:
            if depth > 50:
                raise GrammarError(f"$ref cycle at {_ptr(path)}")
            target, tpath = self.resolve(schema["$ref"], path)
            rest = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
            schema = merge_all_of([target, rest], path, self) if rest else target
            path = tpath
            depth += 1
        return schema, path

    # -- symbols ----------------------------------------------------------------------------------------

    def symbol(self, schema, path: str) -> str | None:
        """The grammar symbol for values valid under ``schema`` (None: no value is valid)."""
        if isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
            return self.ref_symbol(schema["$ref"], path)
        key = json.dumps(schema, sort_keys=True, default=str)
        if key in self._memo:
            return self._memo[key]
        sym = self.emit(self.shape(schema, path), path)
        self._memo[key] = sym
        return sym

    def ref_symbol(self, ref: str, path: str) -> str | None:
        target, tpath = self.resolve(ref, path)
        if tpath in self._ref_rules:
            return self._ref_rules[tpath]
        name = self.w.new_rule("r", _ptr(tpath))
        self._ref_rules[tpath] = name
        sym = self.symbol(target, tpath)
        if sym is None:
            raise GrammarError(f"schema at {_ptr(tpath)} (via $ref at {_ptr(path)}) accepts no value")
        self.w.rule(name, [[sym]])
        return name

    def emit(self, sh: Shape, path: str) -> str | None:
        if sh.any:
            return self.w.any_value()
        alts: list[str] = []
        if sh.any_string:
            alts.append(self.w.terminal(jt.STRING_RE))
        elif sh.strings:
            alts.append(self.w.terminal(rx.to_regex(rx.alt(*sh.strings))))
        if sh.any_number:
            alts.append(self.w.terminal(jt.NUMBER_RE))
        elif sh.numbers:
            # One terminal for every number form; the right context keeps Python's match longest.
            nums = [
                n[1][0]
                if n[0] == "cat" and n[1][-1] == jt.NUMBER_END and len(n[1]) == 2
                else rx.cat(*n[1][:-1])
                if n[0] == "cat" and n[1][-1] == jt.NUMBER_END
                else n
                for n in sh.numbers
            ]
            alts.append(self.w.terminal(rx.to_regex(rx.cat(rx.alt(*nums), jt.NUMBER_END))))
        alts += [f'"{lit}"' for lit in ("true", "false", "null") if lit in sh.literals]
        if sh.empty_object:
            alts.append(self.w.empty("object"))
        alts += sh.objects
        if sh.empty_array:
            alts.append(self.w.empty("array"))
        alts += sh.arrays
        if not alts:
            return None
        if len(alts) == 1:
            return alts[0]
        name = self.w.new_rule("v", _ptr(path))
        self.w.rule(name, [[a] for a in alts])
        return name

    # -- shapes -----------------------------------------------------------------------------------------

    def shape(self, schema, path: str) -> Shape:
        if schema is True:
            return Shape(any=True)
        if schema is False:
            return Shape()
        if not isinstance(schema, dict):
            raise GrammarError(f"schema at {_ptr(path)} must be an object or a boolean")
        for kw in schema:
            if kw in UNSUPPORTED and not (kw == "multipleOf" and schema[kw] == 1):
                self.fail(f"unsupported keyword '{kw}' at {_ptr(path)}/{kw}")
        if "$ref" in schema:
            if path in self._resolving:
                return self.recursive_ref_shape(schema, path)
            self._resolving.add(path)
            try:
                target, tpath = self.deref(schema, path)
                return self.shape(target, tpath)
            finally:
                self._resolving.discard(path)
        if "allOf" in schema:
            return self.shape(merge_all_of([schema], path, self), path)
        branches_kw = "anyOf" if "anyOf" in schema else "oneOf" if "oneOf" in schema else None
        if branches_kw:
            rest = {k: v for k, v in schema.items() if k != branches_kw}
            branches = schema[branches_kw]
            if not isinstance(branches, list) or not branches:
                raise GrammarError(f"{branches_kw} at {_ptr(path)} must be a non-empty array")
            out = Shape()
            shapes = []
            for i, b in enumerate(branches):
                bpath = f"{path}/{branches_kw}/{i}"
                sub = merge_all_of([rest, b], bpath, self) if set(rest) - ANNOTATIONS else b
                sh = self.shape(sub, bpath)
                shapes.append(sh)
                out.merge(sh)
            if branches_kw == "oneOf":
                self.check_disjoint(shapes, branches, path)
            return out
        return self.plain_shape(schema, path)

    def recursive_ref_shape(self, schema: dict, path: str) -> Shape:
        """A ``$ref`` met again while its own shape is being built (``child: Node | None``, as pydantic
        writes ``Optional[Self]``). An object or array target consumes a bracket first, so its named
        rule can stand for it; anything else would recurse without consuming input."""
        target, tpath = self.resolve(schema["$ref"], path)
        kinds = _declared_kinds(target, path) if set(schema) - ANNOTATIONS == {"$ref"} else None
        if kinds == {"object"}:
            return Shape(objects=[self.ref_symbol(schema["$ref"], path)])
        if kinds == {"array"}:
            return Shape(arrays=[self.ref_symbol(schema["$ref"], path)])
        raise GrammarError(f"$ref at {_ptr(path)} recurses without consuming input")

    def check_disjoint(self, shapes: list[Shape], branches, path: str) -> None:
        """oneOf is accepted when branches are provably disjoint: by kind, or by a discriminating const."""
        kinds = [self._validated_kinds(b, sh, path) for b, sh in zip(branches, shapes)]
        for i in range(len(shapes)):
            for j in range(i + 1, len(shapes)):
                common = kinds[i] & kinds[j]
                if not common:
                    continue
                if common <= {"object"} and _discriminated(self, branches[i], branches[j], path):
                    continue
                self.fail(f"oneOf at {_ptr(path)}: branches {i} and {j} are not provably disjoint")

    def _validated_kinds(self, branch, shape: Shape, path: str) -> set[str]:
        """The kinds a branch accepts under JSON Schema, not under generation's narrowing: without
        ``type`` (or const/enum), ``{"pattern": "^a"}`` also accepts every number, object, ...."""
        b, _ = self.deref(branch, path) if isinstance(branch, dict) else (branch, path)
        if b is False:
            return set()
        if isinstance(b, dict) and set(b) & {"type", "const", "enum", "anyOf", "oneOf", "allOf"}:
            return shape.kinds()
        return set(ALL_TYPES)

    def plain_shape(self, schema: dict, path: str) -> Shape:
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list):
                raise GrammarError(f"enum at {_ptr(path)} must be an array")
            for kw in sorted(set(schema) & (OBJECT_KW | ARRAY_KW | STRING_KW | NUMBER_KW | {"multipleOf"})):
                # Not applied to the listed values: refuse rather than allow values the schema rejects.
                kind = "const" if "const" in schema else "enum"
                self.fail(
                    f"'{kw}' next to {kind} at {_ptr(path)}/{kw} is not supported; list only valid values"
                )
            types = schema_types(schema, path)
            sh = Shape()
            for v in values:
                if (
                    types is None
                    or type_of(v) in types
                    or (type_of(v) == "integer" and "number" in types)
                    or (type_of(v) == "number" and "integer" in types and float(v).is_integer())
                ):
                    sh.merge(self.literal_shape(v, path))
            return sh
        types = schema_types(schema, path)
        if types is None:
            present = set(schema)
            types = set()
            if present & OBJECT_KW:
                types.add("object")
            if present & ARRAY_KW:
                types.add("array")
            if present & STRING_KW:
                types.add("string")
            if present & NUMBER_KW:
                types.add("number")
            if not types:
                types = set(ALL_TYPES)
        if schema.get("nullable") is True:
            types.add("null")
        sh = Shape()
        if set(ALL_TYPES) <= types and not (set(schema) - ANNOTATIONS - {"type", "nullable"}):
            return Shape(any=True)
        if "string" in types:
            self.string_shape(schema, path, sh)
        if "number" in types or "integer" in types:
            self.number_shape(schema, path, "number" not in types, sh)
        if "boolean" in types:
            sh.literals |= {"true", "false"}
        if "null" in types:
            sh.literals.add("null")
        if "object" in types:
            object_shape(self, schema, path, sh)
        if "array" in types:
            array_shape(self, schema, path, sh)
        return sh

    def literal_shape(self, v, path: str) -> Shape:
        sh = Shape()
        t = type_of(v)
        if t == "string":
            sh.strings.append(jt.exact_string(v))
        elif t in ("integer", "number"):
            forms = {json.dumps(v)}
            if isinstance(v, float) and v.is_integer():
                forms.add(str(int(v)))
            elif isinstance(v, int):
                forms.add(f"{v}.0")
            sh.numbers.append(rx.alt(*(rx.lit(f) for f in sorted(forms))))
        elif t == "boolean":
            sh.literals.add("true" if v else "false")
        elif t == "null":
            sh.literals.add("null")
        else:
            literal_structure(self, v, path, sh)
        return sh

    def string_shape(self, schema: dict, path: str, sh: Shape) -> None:
        lo = int(schema.get("minLength", 0))
        hi = schema.get("maxLength")
        hi = None if hi is None else int(hi)
        if hi is not None and hi < lo:
            return
        contents: list = []
        patterns = schema.get("pattern", [])
        for p in [patterns] if isinstance(patterns, str) else patterns:
            contents.append(jt.pattern_ast(p, f"{_ptr(path)}/pattern"))
        formats = schema.get("format", [])
        for fmt in [formats] if isinstance(formats, str) else formats:
            if fmt in jt.FORMATS:
                contents.append(jt.format_ast(fmt))
            else:
                warnings.warn(
                    f"format {fmt!r} at {_ptr(path)}/format is not enforced", GrammarWarning, stacklevel=3
                )
        if not contents and lo == 0 and hi is None:
            sh.any_string = True
            return
        sh.strings.append(jt.string_terminal(contents[0] if contents else None, lo, hi, contents[1:]))

    def number_shape(self, schema: dict, path: str, integer: bool, sh: Shape) -> None:
        if schema.get("multipleOf") == 1:
            integer = True

        def dec(k: str):
            v = schema.get(k)
            if v is None or isinstance(v, bool):
                return None
            if not isinstance(v, (int, float)):
                raise GrammarError(f"{k} at {_ptr(path)}/{k} must be a number")
            return Decimal(str(v))

        lo, hi = dec("minimum"), dec("maximum")
        lo_s = hi_s = False
        emin, emax = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
        if emin is True:
            lo_s = True
        elif dec("exclusiveMinimum") is not None and (lo is None or dec("exclusiveMinimum") >= lo):
            lo, lo_s = dec("exclusiveMinimum"), True
        if emax is True:
            hi_s = True
        elif dec("exclusiveMaximum") is not None and (hi is None or dec("exclusiveMaximum") <= hi):
            hi, hi_s = dec("exclusiveMaximum"), True
        if lo is None and hi is None:
            if integer:
                sh.numbers.append(rx.parse(jt.INTEGER_RE))
            else:
                sh.any_number = True
            return
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_s or hi_s))):
            return
        try:
            sh.numbers.append(jt.number_terminal(lo, lo_s, hi, hi_s, integer, _ptr(path)))
        except (GrammarError, ValueError):
            return


def _discriminated(comp: SchemaCompiler, a, b, path: str) -> bool:
    """Two object schemas with a common required property whose const/enum values are disjoint."""
    a, _ = comp.deref(a, path)
    b, _ = comp.deref(b, path)
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    pa, pb = a.get("properties", {}), b.get("properties", {})
    for k in set(a.get("required", [])) & set(b.get("required", [])) & set(pa) & set(pb):
        va, vb = const_values(pa[k]), const_values(pb[k])
        if va is not None and vb is not None and not (va & vb):
            return True
    return False


def _normalise(schema):
    if schema is None:
        return {"type": "object", "additionalProperties": True}
    if isinstance(schema, (str, bytes)):
        try:
            return json.loads(schema)
        except ValueError as e:
            raise GrammarError(f"schema is not valid JSON: {e}") from None
    return schema


def json_schema_to_lark(schema, *, lenient: bool = False) -> str:
    """Lark grammar text for a JSON Schema (``None``: any JSON object; ``True``/``{}``: any value)."""
    return SchemaCompiler(_normalise(schema), lenient).lark()


_CACHE: OrderedDict = OrderedDict()


def compile_json_schema(schema, info, *, lenient: bool = False, cache: bool = True, max_states: int = 20_000):
    """Compile a JSON Schema (dict, bool, JSON text, or None for "any JSON object") for ``info``.

    Compiled grammars are cached per (schema, tokenizer) -- 64 most recent -- so repeated requests with
    one schema share warm mask caches. Raises GrammarError naming the keyword and JSON pointer.
    """
    schema = _normalise(schema)
    key = (json.dumps(schema, sort_keys=True, default=str), id(info), lenient)
    if cache and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    comp = SchemaCompiler(schema, lenient)
    text = comp.lark()
    try:
        g = CompiledGrammar(text, info, source="<json schema>", max_states=max_states)
    except GrammarError as e:
        where = comp.w.where_of(str(e))
        if where is None:
            raise
        raise GrammarError(f"schema near {where}: alternatives overlap or are ambiguous ({e})") from None
    if cache:
        _CACHE[key] = g
        if len(_CACHE) > 64:
            _CACHE.popitem(last=False)
    return g
