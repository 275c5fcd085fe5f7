"""Writing generated grammars (JSON Schema, tool calls) as Lark text.

Rules are kept as lists of alternatives of symbols; terminals are deduplicated by regex, so equal
strings/keys share one terminal across the grammar (LALR can then follow several branches of a union
in parallel until they differ). Each generated rule remembers the JSON pointer it came from, so that
LALR conflicts can be reported against the schema.
"""

from __future__ import annotations

import re

from ..errors import GrammarError
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
