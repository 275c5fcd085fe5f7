"""Objects and arrays of a JSON Schema as LALR-friendly rules.

Objects: declared properties in schema order, then extra members (``patternProperties``, then
``additionalProperties``). ``S(i, c)`` is "before declared property i, after c members": it either
emits property i (preceded by ``,`` when c > 0) or skips it when optional. The member count is tracked
only as far as ``minProperties``/``maxProperties`` need. Unbounded tails are left-recursive so the
parser stack does not grow with the number of members.

With ``property_order="any"``, an object of at most ``ANY_ORDER_MAX`` declared properties takes its
members in any order instead: ``A(seen, c)`` is "after the declared names ``seen`` and c members"
(exact: each name once, the required ones before ``}``). That is 2**n rules, so bigger objects, and
objects past a schema's ``ANY_ORDER_STATES``, keep the schema's order.

Arrays: ``A(k)`` is "after k items": ``]`` once k >= minItems, or ``, item_k``; past the prefix items
and minItems an unbounded tail is one left-recursive rule.

Both return the *non-empty* form and whether ``{}``/``[]`` is allowed: the empty form is shared by
the union so two branches that both allow it do not conflict.
"""

from __future__ import annotations

import json
import math
import re

from .. import regex as rx
from ..dfa import compile_regex, product
from ..errors import GrammarError
from . import json_terminals as jt

NOT_ALL = "x-radixchat-not-all"  # sets of names not all present: json_schema.SchemaCompiler.exclusive, not
REQUIRES = "x-radixchat-requires"  # [name, [names it requires]]: dependencies (json_schema.presence_rules)

MAX_UNROLL = 2000
MAX_TRACKED = 10  # names tracked for oneOf narrowing (2**n rule variants at worst)
ANY_ORDER_MAX = 8  # declared properties an object may write in any order (2**n rules; see _any_order_rules)
ANY_ORDER_STATES = 8192  # parser states any order may add to a schema (see _any_order_cost)


def _esc(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _pair(comp, key: str, vsym: str, path: str) -> str:
    pairs = comp.pairs
    got = pairs.get((key, vsym))
    if got is None:
        kt = comp.w.terminal(rx.to_regex(jt.exact_string(key)), "K")
        got = pairs[(key, vsym)] = comp.w.new_rule("p", f"#{path}/properties/{_esc(key)}")
        comp.w.rule(got, [[kt, '":"', vsym]])
    return got


def _string_regex(comp, schema, path: str):
    """The JSON-text regex AST of the strings a schema allows (None: any string; False: none)."""
    sh = comp.shape(schema, path)
    if sh.any or sh.any_string:
        return None
    if not sh.strings:
        return False
    return rx.alt(*sh.strings)


def object_shape(comp, schema: dict, path: str, sh) -> None:
    props = schema.get("properties") or {}
    required = list(schema.get("required") or [])
    addl = schema.get("additionalProperties", comp.default_additional(schema))
    pattern_props = schema.get("patternProperties") or {}
    minp = int(schema.get("minProperties", 0))
    maxp = schema.get("maxProperties")
    maxp = None if maxp is None else int(maxp)
    names_ast = None
    names_dfa = None
    if "propertyNames" in schema:
        names_ast = _string_regex(comp, schema["propertyNames"], f"{path}/propertyNames")
        if names_ast is False:
            if minp == 0 and not required:
                sh.empty_object = True
            return
        if names_ast is not None:
            names_dfa = compile_regex(rx.to_regex(names_ast))
    names = list(props) + [r for r in required if r not in props]
    entries: list[tuple[str, str, bool]] = []
    for name in names:
        matching = [s for pat, s in pattern_props.items() if re.search(pat, name)]
        if name not in props and addl is False and not matching and "additionalProperties" in schema:
            return  # a required name that no keyword allows: no object is valid
        sub = props.get(name, addl if addl is not False else True)
        if matching:
            sub = {"allOf": [sub, *matching]}
        req = name in required
        ok = names_dfa is None or names_dfa.matches(json.dumps(name, ensure_ascii=False).encode())
        vsym = comp.symbol(sub, f"{path}/properties/{_esc(name)}") if ok else None
        if vsym is None:
            if req:
                return
            continue
        entries.append((name, vsym, req))
    # Extra members: key terminals exclude the declared names (and earlier patterns).
    excluded = [jt.exact_string(n) for n in names]
    extras: list[tuple[str, str]] = []
    pattern_dfas = []
    for pat, sub in pattern_props.items():
        ppath = f"{path}/patternProperties/{_esc(pat)}"
        body = jt.string_terminal(jt.pattern_ast(pat, ppath))
        d = compile_regex(rx.to_regex(body))
        for other_pat, other in pattern_dfas:
            try:
                product(d, other, "and")
            except GrammarError:
                continue
            comp.fail(
                f"patternProperties at {ppath}: overlaps pattern {other_pat!r} (keys matching both unsupported)"
            )
        pattern_dfas.append((pat, d))
        vsym = comp.symbol(sub, ppath)
        if vsym is not None:
            extras.append((_key_terminal(comp, body, excluded, names_ast), vsym))
        excluded.append(body)
    extra_key = None
    if addl is not False:
        vsym = comp.symbol(addl, f"{path}/additionalProperties")
        if vsym is not None:
            body = rx.parse(jt.KEY_STRING_RE)
            extra_key = _key_terminal(comp, body, excluded, names_ast)
            extras.append((extra_key, vsym))
    # Presence rules over declared names, checked at "}": a set not all present (oneOf narrowing,
    # ``not: {required}``), and a name present only with the names it requires (``dependencies``).
    index = {name: k for k, (name, _, _) in enumerate(entries)}
    rules: list[tuple[int, int | None]] = []  # (all present, and not all of these present) is refused
    for names in schema.get(NOT_ALL, []):
        if any(nm not in index for nm in names):
            continue  # a name this object never writes: the set can never be complete
        rules.append((_bits(index, names), None))
    for name, needs in schema.get(REQUIRES, []):
        if name not in index:
            continue  # never written: nothing to require
        if any(nm not in index for nm in needs):
            rules.append((_bits(index, [name]), None))  # needs a name this object never writes
        else:
            rules.append((_bits(index, [name]), _bits(index, needs)))
    if len({b for r in rules for m in r if m for b in range(len(entries)) if m >> b & 1}) > MAX_TRACKED:
        raise GrammarError(
            f"object at #{path}: too many properties in presence rules (oneOf, not, dependencies)"
        )
    empty_ok = minp == 0 and not any(req for _, _, req in entries) and (maxp is None or maxp >= 0)
    if empty_ok and not _refused(rules, 0):
        sh.empty_object = True
    cost = _any_order_cost(len(entries), max(minp, 1), maxp, bool(extras))
    if comp.property_order == "any" and cost is not None and comp.any_order_left >= cost:
        comp.any_order_left -= cost
        sym = _any_order_rules(comp, path, entries, extras, max(minp, 1), maxp, rules)
    else:
        sym = _object_rules(comp, path, entries, extras, max(minp, 1), maxp, rules)
    if sym is None:
        return
    sh.objects.append(sym)
    if extra_key is not None:
        # Every declared name's key is a string the extra key takes up to its closing quote: where the
        # extra key may come, the masks lex with all of them (see compiler.CompiledGrammar ``families``).
        keys = (comp.w.terms.get(rx.to_regex(jt.exact_string(name))) for name, _, _ in entries)
        members = frozenset(k for k in keys if k is not None)
        if members:
            comp.w.families.append((extra_key, members, tuple(name for name, _, _ in entries)))


def _key_terminal(comp, body, excluded: list, names_ast) -> str:
    looks = []
    if excluded:
        looks.append(("look", False, rx.alt(*excluded)))
    if names_ast is not None:
        # Look-aheads may only open a terminal: one that opens names_ast (e.g. its maxLength next to
        # its pattern) joins the others at the start instead of nesting.
        parts = list(names_ast[1]) if names_ast[0] == "cat" else [names_ast]
        while parts and parts[0][0] == "look":
            looks.append(parts.pop(0))
        if parts:
            looks.append(("look", True, rx.cat(*parts)))
    return comp.w.terminal(rx.to_regex(rx.cat(*looks, body)), "K")


def _bits(index: dict[str, int], names) -> int:
    return sum(1 << index[nm] for nm in set(names))


def _refused(rules: list[tuple[int, int | None]], seen: int) -> bool:
    """Whether an object whose tracked names ``seen`` are present breaks a presence rule."""
    return any(seen & have == have and (need is None or seen & need != need) for have, need in rules)


def _any_order_cost(n: int, minp: int, maxp: int | None, extras: bool) -> int | None:
    """Parser states any order adds for n declared names: ~(n + 3) per rule ``A(seen, c)`` (measured:
    2,800 for n = 8), one rule per subset of names and member count the bounds track; None past
    ``ANY_ORDER_MAX`` names or ``MAX_UNROLL`` rules."""
    if n > ANY_ORDER_MAX:
        return None
    top = minp if maxp is None else maxp  # the count is tracked up to here (see _any_order_rules)
    rules = sum(
        math.comb(n, k) * (top - min(k, top) + 1 if extras else 1)
        for k in range(n + 1)
        if maxp is None or k <= maxp
    )
    return None if rules > MAX_UNROLL else (n + 3) * rules


def _extra_pair(w, base: str, path: str, extras) -> str | None:
    """The rule of one extra member (any of ``extras``: (key terminal, value symbol)), if any."""
    if not extras:
        return None
    xpair = f"{base}_x"
    w.where[xpair] = f"#{path}"
    w.rule(xpair, [[k, '":"', v] for k, v in extras])
    return xpair


def _braced(w, base: str, body: str | None) -> str | None:
    if body is None:
        return None
    w.rule(base, [['"{"', body, '"}"']])
    return base


def _object_rules(
    comp, path: str, entries, extras, minp: int, maxp: int | None, rules: list[tuple[int, int | None]]
) -> str | None:
    w = comp.w
    base = w.new_rule("o", f"#{path}")
    n = len(entries)
    cap = maxp if maxp is not None else max(minp, 1)
    memo: dict = {}
    xpair = _extra_pair(w, base, path, extras)
    if maxp is not None and (maxp + 1) * (n + 1) > MAX_UNROLL:
        raise GrammarError(f"maxProperties at #{path}/maxProperties is too large to unroll")

    def nxt_count(c: int) -> int:
        return c + 1 if maxp is not None else min(c + 1, cap)

    def tail(c: int) -> str | None:
        key = ("e", c)
        if key in memo:
            return memo[key]
        name = f"{base}_e{c}"
        memo[key] = name
        alts: list[list[str]] = []
        if xpair is not None and maxp is None and c >= cap:
            # Right-recursive with the comma first: after a declared pair, "," is shifted before the
            # key decides between the next declared name and an extra key (left recursion had to
            # reduce an empty loop before the comma: a conflict as soon as two names were declared).
            loop = f"{base}_loop"
            w.rule(loop, [[], ['","', xpair, loop]])
            alts.append([loop])
        else:
            if c >= minp:
                alts.append([])
            if xpair is not None and (maxp is None or c + 1 <= maxp):
                t = tail(nxt_count(c))
                if t is not None:
                    alts.append((['","'] if c > 0 else []) + [xpair, t])
        if not alts:
            memo[key] = None
            return None
        w.rule(name, alts)
        return name

    tracked = 0
    for have, need in rules:
        tracked |= have | (need or 0)

    def S(i: int, c: int, seen: int = 0) -> str | None:
        """Before declared property i, after c members; ``seen``: the tracked names written so far."""
        if i == n:
            return None if _refused(rules, seen) else tail(c)
        key = (i, c, seen)
        if key in memo:
            return memo[key]
        name = f"{base}_{i}_{c}" + (f"_s{seen}" if rules else "")
        memo[key] = name
        key_name, vsym, req = entries[i]
        alts: list[list[str]] = []
        if maxp is None or c + 1 <= maxp:
            rest = S(i + 1, nxt_count(c), seen | (tracked & (1 << i)))
            if rest is not None:
                alts.append((['","'] if c > 0 else []) + [_pair(comp, key_name, vsym, path), rest])
        if not req:
            rest = S(i + 1, c, seen)
            if rest is not None:
                alts.append([rest])
        if not alts:
            memo[key] = None
            return None
        w.rule(name, alts)
        return name

    try:
        return _braced(w, base, S(0, 0))
    finally:
        # the recursive closures hold themselves (and the writer's rules): unbound now, they go with
        # this call, not with the next full collection (each schema left thousands of cyclic objects)
        S = tail = nxt_count = None  # noqa: F841


def _any_order_rules(
    comp, path: str, entries, extras, minp: int, maxp: int | None, rules: list[tuple[int, int | None]]
) -> str | None:
    """Members in any order. ``A(seen, c)``: after the declared names ``seen`` (bits of ``entries``) and
    c members, c counted only as far as the bounds need. It closes once the required names are in
    ``seen`` (and the presence rules hold), or writes ``,`` (when c > 0) and then a declared name not yet
    written, or an extra member. Extra members past the count that matters loop on the same state."""
    w = comp.w
    base = w.new_rule("o", f"#{path}")
    required = sum(1 << k for k, (_, _, req) in enumerate(entries) if req)
    xpair = _extra_pair(w, base, path, extras)
    pairs = [_pair(comp, key_name, vsym, path) for key_name, vsym, _ in entries]
    memo: dict[tuple[int, int], str | None] = {}

    def A(seen: int, c: int) -> str | None:
        key = (seen, c)
        if key in memo:
            return memo[key]
        name = memo[key] = f"{base}_a{seen}_{c}"
        alts: list[list[str]] = []
        if c >= minp and seen & required == required and not _refused(rules, seen):
            alts.append([])
        more = maxp is None or c < maxp
        nxt = min(c + 1, minp) if maxp is None else c + 1
        comma = ['","'] if c > 0 else []
        if more:
            for k, pair in enumerate(pairs):
                if not seen >> k & 1 and (rest := A(seen | 1 << k, nxt)) is not None:
                    alts.append([*comma, pair, rest])
            if xpair is not None and nxt != c and (rest := A(seen, nxt)) is not None:
                alts.append([*comma, xpair, rest])
        if not alts:  # an extra member could only lead back to this state, which never closes
            memo[key] = None
            return None
        if more and xpair is not None and nxt == c:
            alts.append([*comma, xpair, name])
        w.rule(name, alts)
        return name

    try:
        return _braced(w, base, A(0, 0))
    finally:
        A = None  # noqa: F841 (a recursive closure: see _object_rules)


def array_shape(comp, schema: dict, path: str, sh) -> None:
    items = schema.get("items")
    prefix = schema.get("prefixItems")
    if prefix is None and isinstance(items, list):
        prefix, rest, rest_kw = items, schema.get("additionalItems", True), "additionalItems"
    else:
        prefix, rest, rest_kw = prefix or [], True if items is None else items, "items"
    mini = int(schema.get("minItems", 0))
    maxi = schema.get("maxItems")
    maxi = None if maxi is None else int(maxi)
    psyms: list[str] = []
    for k, sub in enumerate(prefix):
        sym = comp.symbol(sub, f"{path}/prefixItems/{k}")
        if sym is None:
            maxi = k if maxi is None else min(maxi, k)
            break
        psyms.append(sym)
    rsym = comp.symbol(rest, f"{path}/{rest_kw}") if rest is not False else None
    if rsym is None:
        maxi = len(psyms) if maxi is None else min(maxi, len(psyms))
    if maxi is not None and mini > maxi:
        return
    if mini == 0:
        sh.empty_array = True
    if maxi == 0:
        return
    w = comp.w
    base = w.new_rule("a", f"#{path}")
    k0 = max(len(psyms), mini, 1)
    if maxi is not None and maxi > MAX_UNROLL:
        raise GrammarError(f"maxItems at #{path}/maxItems is too large to unroll")
    if k0 > MAX_UNROLL:
        raise GrammarError(f"minItems at #{path}/minItems is too large to unroll")

    def item(k: int) -> str:
        return psyms[k] if k < len(psyms) else rsym

    # Rule {base}_k: the items after the k-th; unrolled up to k0 (or maxItems), then a loop.
    w.rule(base, [['"["', item(0), f"{base}_1", '"]"']])
    for k in range(1, (maxi if maxi is not None else k0) + 1):
        name = f"{base}_{k}"
        if maxi is None and k >= k0:
            w.rule(name, [[], [name, '","', rsym]])
            break
        alts: list[list[str]] = [[]] if k >= mini else []
        if maxi is None or k < maxi:
            alts.append(['","', item(k), f"{base}_{k + 1}"])
        w.rule(name, alts)
    sh.arrays.append(base)


def literal_structure(comp, v, path: str, sh) -> None:
    """An exact object or array value (from ``enum``/``const``)."""
    w = comp.w
    if isinstance(v, dict):
        if not v:
            sh.empty_object = True
            return
        parts: list[str] = ['"{"']
        for i, (k, val) in enumerate(v.items()):
            if i:
                parts.append('","')
            parts.append(_pair(comp, k, comp.emit(comp.literal_shape(val, path), path), path))
        parts.append('"}"')
        name = w.new_rule("c", f"#{path}")
        w.rule(name, [parts])
        sh.objects.append(name)
    else:
        if not v:
            sh.empty_array = True
            return
        parts = ['"["']
        for i, val in enumerate(v):
            if i:
                parts.append('","')
            parts.append(comp.emit(comp.literal_shape(val, path), path))
        parts.append('"]"')
        name = w.new_rule("c", f"#{path}")
        w.rule(name, [parts])
        sh.arrays.append(name)
