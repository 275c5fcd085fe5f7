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
import math
import re
import warnings
from collections import OrderedDict
from decimal import Decimal

# Imported with the module, not on the first schema that needs it: a process that freezes its heap once
# loaded (``radixchat.chat.loading.settled_heap``) then never has jsonschema's many objects in the
# collector's care (a module imported later lives as long, and each full collection walked it).
import jsonschema

from .. import regex as rx
from ..compiler import CompiledGrammar
from ..errors import GrammarError, TooManyStates, UnenforceableSchema
from ..limits import COMPILE_SECONDS, check, deadline, gc_paused
from . import json_terminals as jt
from .allof import merge_all_of
from .json_objects import ANY_ORDER_STATES, NOT_ALL, REQUIRES, array_shape, literal_structure, object_shape
from .json_shape import ALL_TYPES, Shape, const_values, is_annotation, schema_types, type_of
from .lark_text import LarkWriter
from .string_grammar import X_GRAMMAR, X_GRAMMAR_START, embed_string_grammar

PRESENCE_KW = {"not", "dependencies", "dependentRequired"}  # some forms become presence rules
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
STRING_KW = {"minLength", "maxLength", "pattern", "format", X_GRAMMAR}
NUMBER_KW = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


class GrammarWarning(UserWarning):
    """An unsupported schema feature was ignored (``lenient=True``)."""


def _string_keywords(schema: dict) -> set[str]:
    """The keywords of an untyped schema that make us read it as a string: a ``format`` only when it is
    one we know (``{"format": "positiveInteger"}`` is an annotation: any value)."""
    present = set(schema) & STRING_KW
    fmt = schema.get("format")
    if isinstance(fmt, str) and fmt not in jt.FORMATS and fmt not in jt.UNENFORCED_FORMATS:
        present.discard("format")
    return present


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


_REFS = re.compile(r'"\$(?:ref|dynamicRef|recursiveRef)"')  # keywords that point elsewhere in the schema


def _assertions(schema: dict) -> set[str]:
    """The keywords of ``schema`` that may change which values are valid (not annotations)."""
    return {k for k in schema if not is_annotation(k)}


def _ptr(path: str) -> str:
    return "#" + path


#: Where a length bound must be checked by a look-ahead next to a pattern or format (a product DFA with
#: one copy of the pattern's states per count), a longer ``maxLength`` is generated as this one (valid
#: values only). Lengths alone, and patterns that are one counted character class, are counted
#: (``grammar.counted``): any bound costs the same.
MAX_STRING_BOUND = 512

#: Readings of an absent ``additionalProperties`` (see ``SchemaCompiler.default_additional``).
ADDITIONAL_PROPERTIES = ("auto", "false", "true")

#: Orders an object's members may come in: the schema's (a generation default, as llguidance's and
#: llama.cpp's) or any (JSON Schema's reading; exact up to ``json_objects.ANY_ORDER_MAX`` properties).
PROPERTY_ORDERS = ("schema", "any")


class SchemaCompiler:
    """Builds the Lark text for one root schema. ``lenient`` turns unsupported keywords into warnings;
    ``additional_properties`` is the reading of an absent ``additionalProperties``; ``property_order``
    the order members may come in (``PROPERTY_ORDERS``)."""

    def __init__(
        self,
        root,
        lenient: bool = False,
        additional_properties: str = "auto",
        property_order: str = "schema",
    ) -> None:
        for arg, value, allowed in (
            ("additional_properties", additional_properties, ADDITIONAL_PROPERTIES),
            ("property_order", property_order, PROPERTY_ORDERS),
        ):
            if value not in allowed:
                raise GrammarError(f"{arg} must be one of {', '.join(allowed)}, not {value!r}")
        self.root = root
        self.lenient = lenient
        self.additional_properties = additional_properties
        self.property_order = property_order
        self.any_order_left = ANY_ORDER_STATES  # see json_objects.object_shape
        #: What lenient mode left to the final validation: one line per keyword ("uniqueItems at #/x").
        self.not_enforced: list[str] = []
        self.w = LarkWriter()
        self._memo: dict[str, str | None] = {}
        self._ref_rules: dict[str, str] = {}
        self._resolving: set[str] = set()
        self.pairs: dict[tuple[str, str], str] = {}
        self.start_symbol: str | None = None  # set by ``lark()``

    # -- entry point ------------------------------------------------------------------------------------

    def lark(self) -> str:
        sym = self.symbol(self.root, "")
        if sym is None:
            raise GrammarError("schema at # accepts no value")
        self.start_symbol = sym
        return self.w.text(sym)

    # -- helpers ----------------------------------------------------------------------------------------

    def fail(self, msg: str, error: type[GrammarError] = GrammarError) -> None:
        """Refuse what the grammar cannot enforce (raise ``error``), or in lenient mode note and skip it."""
        if self.lenient:
            self.not_enforced.append(msg)
            warnings.warn(msg + " (ignored: lenient)", GrammarWarning, stacklevel=4)
        else:
            raise error(msg)

    def default_additional(self, schema: dict) -> bool:
        """``additionalProperties`` of an object schema that does not say: ``"auto"`` (the default)
        closes objects that declare ``properties`` or ``patternProperties`` (a generation default, as
        llama.cpp's) and opens those that declare neither (``{"type": "object"}`` is any object, as
        JSON Schema says); ``"true"`` is JSON Schema's reading, ``"false"`` closes every object."""
        if self.additional_properties == "auto":
            return "properties" not in schema and "patternProperties" not in schema
        return self.additional_properties == "true"

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
            rest = {k: v for k, v in schema.items() if k != "$ref" and not is_annotation(k)}
            schema = merge_all_of([target, rest], path, self) if rest else target
            path = tpath
            depth += 1
        return schema, path

    # -- symbols ----------------------------------------------------------------------------------------

    def symbol(self, schema, path: str) -> str | None:
        """The grammar symbol for values valid under ``schema`` (None: no value is valid)."""
        if isinstance(schema, dict) and _assertions(schema) == {"$ref"}:
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
            alts.append(self.w.terminal(rx.to_regex(rx.alt(*sh.strings)), where=_ptr(path)))
        alts += sh.grammars
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
            alts.append(self.w.terminal(rx.to_regex(rx.cat(rx.alt(*nums), jt.NUMBER_END)), where=_ptr(path)))
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
        check(_ptr(path))
        if schema is True:
            return Shape(any=True)
        if schema is False:
            return Shape()
        if not isinstance(schema, dict):
            raise GrammarError(f"schema at {_ptr(path)} must be an object or a boolean")
        listed = "enum" in schema or "const" in schema  # then every keyword filters the listed values
        merged_later = "allOf" in schema  # presence rules are read from the merged schema
        if not merged_later:
            schema = self.presence_rules(schema, path)
        for kw in schema:
            if kw in UNSUPPORTED and not (kw == "multipleOf" and schema[kw] == 1) and not listed:
                if merged_later and kw in PRESENCE_KW:
                    continue
                self.fail(f"unsupported keyword '{kw}' at {_ptr(path)}/{kw}", UnenforceableSchema)
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
            subs = []
            for i, b in enumerate(branches):
                bpath = f"{path}/{branches_kw}/{i}"
                subs.append(merge_all_of([rest, b], bpath, self) if _assertions(rest) else b)
            if branches_kw == "oneOf":
                subs = self.exclusive(subs, path)
            out = Shape()
            for i, sub in enumerate(subs):
                out.merge(self.shape(sub, f"{path}/{branches_kw}/{i}"))
            return out
        return self.plain_shape(schema, path)

    def presence_rules(self, schema: dict, path: str) -> dict:
        """``not`` and ``dependencies`` that only say which declared properties may be present together,
        as the object rules' presence rules (``NOT_ALL``, ``REQUIRES``): ``not: {"required": [a, b]}``
        (or an allOf / anyOf of such), ``dependencies: {a: [b]}``. Other forms stay (and are refused)."""
        if PRESENCE_KW.isdisjoint(schema):
            return schema
        names = set(schema.get("properties") or {}) | set(schema.get("required") or [])
        closed = schema.get("additionalProperties", self.default_additional(schema)) is False

        def writable_known(ns) -> bool:  # every name is declared, or can never be written
            return all(
                isinstance(n, str) and (n in names or closed and not _pattern_named(schema, n)) for n in ns
            )

        out = schema
        sets = _required_sets(schema.get("not"))
        objects_only = schema_types(schema, path) == {"object"} and schema.get("nullable") is not True
        if sets is not None and objects_only and writable_known(n for s in sets for n in s):
            out = {k: v for k, v in out.items() if k != "not"}
            out[NOT_ALL] = [*schema.get(NOT_ALL, []), *sets]
        for kw in ("dependencies", "dependentRequired"):
            deps = schema.get(kw)
            if not isinstance(deps, dict) or not all(isinstance(v, list) for v in deps.values()):
                continue
            if not writable_known([*deps, *(n for v in deps.values() for n in v)]):
                continue
            out = {k: v for k, v in out.items() if k != kw}
            out[REQUIRES] = [*out.get(REQUIRES, []), *([a, list(v)] for a, v in deps.items() if v)]
        return out

    def recursive_ref_shape(self, schema: dict, path: str) -> Shape:
        """A ``$ref`` met again while its own shape is being built (``child: Node | None``, as pydantic
        writes ``Optional[Self]``). An object or array target consumes a bracket first, so its named
        rule can stand for it; anything else would recurse without consuming input."""
        target, tpath = self.resolve(schema["$ref"], path)
        kinds = _declared_kinds(target, path) if _assertions(schema) == {"$ref"} else None
        if kinds == {"object"}:
            return Shape(objects=[self.ref_symbol(schema["$ref"], path)])
        if kinds == {"array"}:
            return Shape(arrays=[self.ref_symbol(schema["$ref"], path)])
        raise GrammarError(f"$ref at {_ptr(path)} recurses without consuming input")

    def exclusive(self, subs: list, path: str) -> list:
        """oneOf: each branch as generated must be invalid under every other branch (JSON Schema's
        reading). Proven by kind, ``const``/``enum``, a required property the other branch forbids or
        whose values it rejects, or a required property the generated branch cannot hold; else, for
        object branches, by narrowing the generated branch so that it never holds all the properties
        the other branch requires (``NOT_ALL``). Anything else is refused (strict) or treated as anyOf
        (lenient)."""
        out = list(subs)
        for i, gen in enumerate(subs):
            for j, val in enumerate(subs):
                if i == j or excludes(self, gen, val, path):
                    continue
                names = _not_all(self, gen, val, path)
                if names is None:
                    self.fail(
                        f"oneOf at {_ptr(path)}: branches {min(i, j)} and {max(i, j)} are not provably disjoint",
                        UnenforceableSchema,
                    )
                    continue
                g, _ = self.deref(out[i], path)
                out[i] = {**g, NOT_ALL: [*g.get(NOT_ALL, []), names]}
        return out

    def listed_and_valid(self, values: list, kind: str, keywords: dict, path: str) -> list:
        """The ``enum``/``const`` values that the keywords beside them also accept (JSON Schema applies
        both: ``{"enum": ["a", "bb"], "minLength": 2}`` is ``"bb"``), checked by JSON Schema's own
        validator, in the root's draft. Keywords that refer elsewhere (``$ref``) are refused instead."""
        first = next(iter(keywords))
        if _REFS.search(json.dumps(keywords)):
            self.fail(f"'{first}' next to {kind} at {_ptr(path)}/{first} uses $ref; list only valid values")
            return values
        check = dict(keywords)
        if isinstance(self.root, dict) and isinstance(self.root.get("$schema"), str):
            check["$schema"] = self.root["$schema"]
        cls = jsonschema.validators.validator_for(check)
        try:
            cls.check_schema(check)
        except jsonschema.SchemaError as exc:
            where = "/".join(map(str, exc.path)) or first
            raise GrammarError(f"'{where}' next to {kind} at {_ptr(path)}: {exc.message}") from None
        validator = cls(check, format_checker=cls.FORMAT_CHECKER)
        return [v for v in values if validator.is_valid(v)]

    def plain_shape(self, schema: dict, path: str) -> Shape:
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list):
                raise GrammarError(f"enum at {_ptr(path)} must be an array")
            others = sorted(set(schema) & (OBJECT_KW | ARRAY_KW | STRING_KW | NUMBER_KW | UNSUPPORTED))
            if others:
                kind = "const" if "const" in schema else "enum"
                values = self.listed_and_valid(values, kind, {kw: schema[kw] for kw in others}, path)
            types = schema_types(schema, path)
            sh = Shape()
            sh.merge_all(
                [
                    self.literal_shape(v, path)
                    for v in values
                    if (
                        types is None
                        or type_of(v) in types
                        or (type_of(v) == "integer" and "number" in types)
                        or (type_of(v) == "number" and "integer" in types and float(v).is_integer())
                    )
                ]
            )
            return sh
        types = schema_types(schema, path)
        if types is None:
            present = set(schema)
            types = set()
            if present & OBJECT_KW:
                types.add("object")
            if present & ARRAY_KW:
                types.add("array")
            if _string_keywords(schema):
                types.add("string")
            if present & NUMBER_KW:
                types.add("number")
            if not types:
                types = set(ALL_TYPES)
        if schema.get("nullable") is True:
            types.add("null")
        sh = Shape()
        if set(ALL_TYPES) <= types and not (_assertions(schema) - {"type", "nullable"}):
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
        if X_GRAMMAR in schema:
            others = sorted(set(schema) & (STRING_KW - {X_GRAMMAR}))
            if others:
                raise GrammarError(
                    f"'{others[0]}' next to {X_GRAMMAR} at {_ptr(path)} is not supported; bound the grammar"
                )
            start = schema.get(X_GRAMMAR_START, "start")
            sh.grammars.append(embed_string_grammar(self.w, schema[X_GRAMMAR], _ptr(path), start))
            return
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
            elif fmt in jt.UNENFORCED_FORMATS:
                self.fail(f"unsupported format '{fmt}' at {_ptr(path)}/format", UnenforceableSchema)
            else:
                warnings.warn(
                    f"format {fmt!r} at {_ptr(path)}/format is not enforced", GrammarWarning, stacklevel=3
                )
        if not contents and lo == 0 and hi is None:
            sh.any_string = True
            return
        if len(contents) == 1 and (lo or hi is not None):
            merged = jt.counted_class(contents[0], lo, hi)
            if merged is not None:
                contents, lo, hi = [merged], 0, None
        if contents and hi is not None and hi > MAX_STRING_BOUND >= lo:
            hi = MAX_STRING_BOUND  # a narrowing: the look-ahead's product has a copy of the pattern per count
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


def _spec_kinds(schema) -> set[str]:
    """The kinds a schema accepts under JSON Schema (``integer`` counted as ``number``)."""
    if schema is False:
        return set()
    if not isinstance(schema, dict):
        return set(ALL_TYPES)
    kinds = set(ALL_TYPES)
    types = schema.get("type")
    if isinstance(types, (str, list)):
        ts = {types} if isinstance(types, str) else set(types)
        kinds = {"number" if t == "integer" else t for t in ts} & set(ALL_TYPES)
        if schema.get("nullable") is True:
            kinds.add("null")
    values = const_values(schema)
    if values is not None:
        vk = {type_of(json.loads(v)) for v in values}
        kinds &= {"number" if k == "integer" else k for k in vk}
    return kinds


def _gen_kinds(comp: SchemaCompiler, schema) -> set[str]:
    """The kinds generated for a schema (our narrowing: no ``type`` means the kinds its keywords imply)."""
    kinds = _spec_kinds(schema)
    if (
        isinstance(schema, dict)
        and "type" not in schema
        and not set(schema) & {"anyOf", "oneOf", "allOf", "$ref"}
    ):
        declared = _declared_kinds(schema, "")
        present = set(schema)
        implied = set(declared or ())
        if _string_keywords(schema):
            implied.add("string")
        if present & NUMBER_KW:
            implied.add("number")
        if implied:
            kinds &= implied
    return kinds


def _prop_schema(schema: dict, name: str, spec: bool, comp: SchemaCompiler):
    """The schema a present property ``name`` must satisfy (None: cannot tell)."""
    props = schema.get("properties") or {}
    if name in props:
        return props[name]
    if any(re.search(p, name) for p in schema.get("patternProperties") or {}):
        return None
    default = True if spec else comp.default_additional(schema)
    return schema.get("additionalProperties", default)


def excludes(comp: SchemaCompiler, gen, val, path: str, depth: int = 0) -> bool:
    """No value generated for ``gen`` is valid under ``val`` (JSON Schema's reading). Sound, not complete."""
    if depth > 8:
        return False
    gen, val = _merged(comp, gen, path), _merged(comp, val, path)
    if gen is False or val is False:
        return True
    if gen is True or val is True or not isinstance(gen, dict) or not isinstance(val, dict):
        return False
    common = _gen_kinds(comp, gen) & _spec_kinds(val)
    if not common:
        return True
    gv, vv = const_values(gen), const_values(val)
    if gv is not None and vv is not None and not gv & vv:
        return True
    if all(k in _SIZES and _sizes_apart(gen, val, k) for k in common):
        return True  # e.g. an empty array (maxItems 0) and a non-empty one (minItems 1)
    if common == {"object"}:
        for q in val.get("required") or []:
            if _prop_schema(gen, q, False, comp) is False:
                return True  # val requires a property gen never writes
        for p in gen.get("required") or []:
            vp = _prop_schema(val, p, True, comp)
            if vp is False or (
                vp is not None
                and excludes(comp, (gen.get("properties") or {}).get(p, True), vp, path, depth + 1)
            ):
                return True
    return False


_SIZES = {"array": ("minItems", "maxItems"), "string": ("minLength", "maxLength"),
          "object": ("minProperties", "maxProperties")}  # fmt: skip


def _sizes_apart(gen: dict, val: dict, kind: str) -> bool:
    """The sizes (items, characters, members) that the two schemas allow for ``kind`` do not meet."""
    lo, hi = _SIZES[kind]

    def bounds(s: dict) -> tuple[float, float]:
        low, high = s.get(lo, 0), s.get(hi)
        low = low if isinstance(low, int) else 0
        if kind == "object" and isinstance(s.get("required"), list):
            low = max(low, len(set(map(str, s["required"]))))
        return low, high if isinstance(high, int) else math.inf

    (g0, g1), (v0, v1) = bounds(gen), bounds(val)
    return g1 < v0 or v1 < g0


def _merged(comp: SchemaCompiler, schema, path: str):
    """``schema`` dereferenced and, where it is an ``allOf`` (a property of two merged branches, say
    ``{"allOf": [{"type": "string"}, {"enum": [...]}]}``), merged, so that its values can be compared;
    unchanged where the merge is refused."""
    if not isinstance(schema, dict):
        return schema
    schema, _ = comp.deref(schema, path)
    if isinstance(schema, dict) and "allOf" in schema:
        try:
            return merge_all_of([schema], path, comp)
        except GrammarError:
            return schema
    return schema


def _required_sets(schema) -> list[list[str]] | None:
    """The sets of names that ``not: schema`` forbids to be all present, when that is all it says:
    ``{"required": [...]}`` (with ``"type": "object"`` or no type), an allOf of those (one set: their
    union) or an anyOf of those (each set); None for anything else."""
    if not isinstance(schema, dict):
        return None
    keys = _assertions(schema)
    if keys == {"anyOf"} and isinstance(schema["anyOf"], list) and schema["anyOf"]:
        parts = [_required_sets(s) for s in schema["anyOf"]]
        return None if any(p is None for p in parts) else [s for p in parts for s in p]
    if keys == {"allOf"} and isinstance(schema["allOf"], list) and schema["allOf"]:
        parts = [_required_sets(s) for s in schema["allOf"]]
        if any(p is None or len(p) != 1 for p in parts):
            return None
        return [list(dict.fromkeys(n for p in parts for n in p[0]))]
    req = schema.get("required")
    if keys - {"type"} != {"required"} or schema.get("type", "object") not in ("object", ["object"]):
        return None
    return [list(req)] if isinstance(req, list) and req and all(isinstance(n, str) for n in req) else None


def _pattern_named(schema: dict, name: str) -> bool:
    return any(re.search(p, name) for p in (schema.get("patternProperties") or {}))


def _not_all(comp: SchemaCompiler, gen, val, path: str) -> list[str] | None:
    """Declared properties of object branch ``gen`` that may not all be present for its values to fail
    ``val``: ``val``'s required ones (None: the branches are not both objects, or ``val`` requires one
    that ``gen`` does not declare)."""
    gen, _ = comp.deref(gen, path) if isinstance(gen, dict) else (gen, path)
    val, _ = comp.deref(val, path) if isinstance(val, dict) else (val, path)
    if not (isinstance(gen, dict) and isinstance(val, dict)) or _gen_kinds(comp, gen) - {"object"}:
        return None
    required = list(val.get("required") or [])
    props = gen.get("properties") or {}
    if not required or any(q not in props for q in required):
        return None
    if set(required) <= set(gen.get("required") or []):
        return None  # gen requires them all itself: forbidding all of them would leave it no value
    return required


def _normalise(schema):
    if schema is None:
        return {"type": "object", "additionalProperties": True}
    if isinstance(schema, (str, bytes)):
        try:
            return json.loads(schema)
        except ValueError as e:
            raise GrammarError(f"schema is not valid JSON: {e}") from None
    return schema


def json_schema_to_lark(
    schema, *, lenient: bool = False, additional_properties: str = "auto", property_order: str = "schema"
) -> str:
    """Lark grammar text for a JSON Schema (``None``: any JSON object; ``True``/``{}``: any value)."""
    return SchemaCompiler(_normalise(schema), lenient, additional_properties, property_order).lark()


_CACHE: OrderedDict = OrderedDict()


def _build(comp: SchemaCompiler, info, max_states: int) -> CompiledGrammar:
    text = comp.lark()  # its errors name the keyword and pointer
    try:
        g = CompiledGrammar(
            text,
            info,
            source="<json schema>",
            max_states=max_states,
            glr=True,
            grammar=comp.w.compiled(comp.start_symbol),
            families=comp.w.families,
        )
    except GrammarError as e:
        where = comp.w.where_of(str(e))
        if where is None:
            raise
        raise type(e)(f"schema near {where}: {e}") from None
    g.not_enforced = tuple(dict.fromkeys(comp.not_enforced))
    return g


def compile_json_schema(
    schema,
    info,
    *,
    lenient: bool = False,
    additional_properties: str = "auto",
    property_order: str = "schema",
    cache: bool = True,
    max_states: int = 20_000,
    max_seconds: float | None = COMPILE_SECONDS,
):
    """Compile a JSON Schema (dict, bool, JSON text, or None for "any JSON object") for ``info``.

    ``additional_properties`` reads an absent ``additionalProperties`` (``SchemaCompiler.default_additional``);
    ``property_order`` is ``"schema"`` (members in the order ``properties`` declares them) or ``"any"``.
    Compiling is bounded (``limits``): past ``max_seconds`` it raises GrammarError.
    Compiled grammars are cached per (schema, tokenizer) -- 64 most recent -- so repeated requests with
    one schema share warm mask caches. Raises GrammarError naming the keyword and JSON pointer.
    """
    schema = _normalise(schema)
    key = (
        json.dumps(schema, sort_keys=True, default=str),
        id(info),
        lenient,
        additional_properties,
        property_order,
    )
    if cache and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    with deadline(max_seconds, "schema"), gc_paused():
        try:
            g = _build(
                SchemaCompiler(schema, lenient, additional_properties, property_order), info, max_states
            )
        except TooManyStates:
            if property_order == "schema":
                raise
            # Any order is best-effort: where its rules push a big schema past the parser's limit, the
            # schema's order (a subset of the valid objects) still compiles.
            g = _build(SchemaCompiler(schema, lenient, additional_properties), info, max_states)
    if cache:
        _CACHE[key] = g
        if len(_CACHE) > 64:
            _CACHE.popitem(last=False)
    return g
