"""Writing generated grammars (JSON Schema, tool calls) as Lark text.

Rules are kept as lists of alternatives of symbols; terminals are deduplicated by regex, so equal
strings/keys share one terminal across the grammar (LALR can then follow several branches of a union
in parallel until they differ). Each generated rule remembers the JSON pointer it came from, so that
LALR conflicts can be reported against the schema.
"""

from __future__ import annotations

import re

from lark.exceptions import LarkError
from lark.grammar import NonTerminal, Rule
from lark.grammar import Terminal as LarkTerminal
from lark.lexer import PatternStr, TerminalDef
from lark.utils import is_id_continue, is_id_start

from ..errors import GrammarError
from ..lark_internals import anonymous_terminal_name, literal_pattern
from . import json_terminals as jt

MAX_RULES = 200_000  # generated rules of one schema (memory bound; a big real schema has a few thousand)

_ANY_RULES = [
    (
        "json_value",
        [["json_object"], ["json_array"], ["STRING"], ["NUMBER"], ['"true"'], ['"false"'], ['"null"']],
    ),
    ("json_object", [['"{"', '"}"'], ['"{"', "json_members", '"}"']]),
    ("json_members", [["json_pair"], ["json_members", '","', "json_pair"]]),
    ("json_pair", [["STRING", '":"', "json_value"]]),
    ("json_array", [['"["', '"]"'], ['"["', "json_elements", '"]"']]),
    ("json_elements", [["json_value"], ["json_elements", '","', "json_value"]]),
]


def lark_regex(pattern: str) -> str:
    """A Python regex as a Lark ``/.../`` literal (slashes escaped, newlines as escapes)."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "/":
            out.append("\\/")
        elif c == "\n":
            out.append("\\n")
        else:
            out.append(c)
        i += 1
    return "/" + "".join(out) + "/"


def lark_string(text: str) -> str:
    """A Lark string literal for exact ``text``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LarkWriter:
    def __init__(self) -> None:
        self.rules: dict[str, list[list[str]]] = {}
        self.terms: dict[str, str] = {}
        self.where: dict[str, str] = {}
        self.priorities: dict[str, int] = {}  # terminal -> Lark priority (0 when absent)
        #: Key families of open objects: (the extra-key terminal, the declared names' key terminals it
        #: excludes, those names); see ``compiler.CompiledGrammar`` (``families``).
        self.families: list[tuple[str, frozenset[str], tuple[str, ...]]] = []
        self._n = 0
        self._any = False

    def new_rule(self, prefix: str, where: str) -> str:
        self._n += 1
        if self._n > MAX_RULES:
            raise GrammarError(f"schema near {where}: too large (over {MAX_RULES} grammar rules)")
        name = f"{prefix}{self._n}"
        self.where[name] = where
        return name

    def rule(self, name: str, alts: list[list[str]]) -> None:
        self.rules[name] = alts

    def terminal(self, regex: str, prefix: str = "T", where: str | None = None, priority: int = 0) -> str:
        if regex == jt.STRING_RE:
            self.terms.setdefault(regex, "STRING")
            return "STRING"
        if regex == jt.NUMBER_RE:
            self.terms.setdefault(regex, "NUMBER")
            return "NUMBER"
        got = self.terms.get(regex)
        if got is None:
            got = self.terms[regex] = f"{prefix}{len(self.terms)}"
            if where is not None:
                self.where[got] = where
            if priority:
                self.priorities[got] = priority
        return got

    def any_value(self) -> str:
        if not self._any:
            self._any = True
            self.terminal(jt.STRING_RE)
            self.terminal(jt.NUMBER_RE)
            for name, alts in _ANY_RULES:
                self.rules[name] = alts
                self.where[name] = "(any JSON value)"
        return "json_value"

    def empty(self, kind: str) -> str:
        name = f"empty_{kind}"
        if name not in self.rules:
            self.rules[name] = [['"{"', '"}"']] if kind == "object" else [['"["', '"]"']]
        return name

    def where_of(self, message: str) -> str | None:
        """The schema pointer of the first generated rule named in a (Lark) message."""
        for name in re.findall(r"\b([a-zA-Z]+\d+)(?:_\w*)?\b", message):
            if name in self.where:
                return self.where[name]
        return None

    def text(self, start: str, ignore_ws: bool = True, header: str = "") -> str:
        lines = [header] if header else []
        lines.append(f"start: {start}")
        for name, alts in self.rules.items():
            body = " | ".join(" ".join(a) for a in alts) if alts else ""
            lines.append(f"{name}: {body}")
        for regex, name in self.terms.items():
            priority = f".{self.priorities[name]}" if name in self.priorities else ""
            lines.append(f"{name}{priority}: {lark_regex(regex)}")
        if ignore_ws:
            lines.append(f"WS: {lark_regex(jt.WS_RE)}")
            lines.append("%ignore WS")
        return "\n".join(lines) + "\n"

    def compiled(self, start: str, ignore_ws: bool = True):
        """What Lark's ``load_grammar(self.text(start)).compile(["start"], set())`` returns — terminal
        definitions, rules and ``%ignore`` names, equal field by field (names of anonymous terminals,
        order, deduplication, unused rules and terminals dropped) — without parsing the text: Lark's
        grammar loader is slow on the biggest schema grammars. None when the text uses something
        this does not reproduce (then Lark parses it). ``tests/grammar/test_grammar_lr.py`` holds the
        two equal on generated grammars."""
        try:
            return self._compiled(start, ignore_ws)
        except (LarkError, KeyError, AssertionError, ValueError):
            return None

    def _compiled(self, start: str, ignore_ws: bool):
        defs: list[tuple[str, str, int]] = [
            (name, lark_regex(regex), self.priorities.get(name, 0)) for regex, name in self.terms.items()
        ]
        if ignore_ws:
            defs.append(("WS", lark_regex(jt.WS_RE), 0))
        terminals = [TerminalDef(name, literal_pattern("REGEXP", lit), prio) for name, lit, prio in defs]
        term_set = {t.name for t in terminals}
        if len(term_set) != len(terminals):
            return None
        anon: dict[str, str] = {}  # literal text -> terminal name
        n_anon = 0
        rules: list[Rule] = []
        body = [("start", [[start]])] + list(self.rules.items())
        rule_names = {name for name, _ in body}
        if len(rule_names) != len(body):
            return None
        for name, alts in body:
            if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
                return None
            seen: dict[tuple, None] = {}
            for alt in alts or [[]]:  # a rule written without alternatives reads as one empty one
                exp = []
                for sym in alt:
                    if sym.startswith('"'):
                        tname = anon.get(sym)
                        if tname is None:
                            p = literal_pattern("STRING", sym)
                            tname = anonymous_terminal_name(p.value)
                            if (
                                tname is None
                                and p.value
                                and is_id_continue(p.value)
                                and is_id_start(p.value[0])
                                and p.value.upper() not in term_set
                            ):
                                tname = p.value.upper()
                            if tname in term_set:
                                tname = None
                            if tname is None:
                                tname = f"__ANON_{n_anon}"
                                n_anon += 1
                            if any(
                                isinstance(t.pattern, PatternStr) and t.pattern.value == p.value
                                for t in terminals
                            ):
                                return None  # the same string written two ways: let Lark decide
                            term_set.add(tname)
                            terminals.append(TerminalDef(tname, p))
                            anon[sym] = tname
                        exp.append(LarkTerminal(tname, filter_out=True))
                    elif sym in term_set and sym[:1].isupper():
                        exp.append(LarkTerminal(sym, filter_out=False))
                    elif sym in rule_names:
                        exp.append(NonTerminal(sym))
                    else:
                        return None  # undefined: Lark says which
                seen.setdefault(tuple(exp), None)
            for i, exp in enumerate(seen):
                rules.append(Rule(NonTerminal(name), list(exp), i, None, None))
        if len(set(rules)) != len(rules):
            return None
        # Lark's filter: drop rules no other rule uses (repeatedly), then terminals no rule uses.
        while True:
            used = {s.name for r in rules for s in r.expansion if not s.is_term and s.name != r.origin.name}
            used.add("start")
            kept = [r for r in rules if r.origin.name in used]
            if len(kept) == len(rules):
                break
            rules = kept
        used_terms = {s.name for r in rules for s in r.expansion if s.is_term}
        ignore = ["WS"] if ignore_ws else []
        terminals = [t for t in terminals if t.name in used_terms or t.name in ignore]
        return terminals, rules, ignore
