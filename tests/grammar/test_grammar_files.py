"""Every grammar in grammars/ builds strict LALR with a bounded state count and lints clean; the
Lark traps are caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from radixchat.grammar import GrammarError, compile_grammar, lint_grammar
from radixchat.grammar.lalr_tables import build_tables

GRAMMARS = sorted((Path(__file__).resolve().parents[2] / "grammars").glob("*.lark"))
MAX_STATES = 500


def test_grammars_directory_has_json_and_tool_call():
    names = {p.name for p in GRAMMARS}
    assert {"json.lark", "tool_call.lark"} <= names


@pytest.mark.parametrize("path", GRAMMARS, ids=[p.name for p in GRAMMARS])
def test_grammar_builds_strict_with_bounded_states_and_lints_clean(path, smol_info):
    tables = build_tables(path.read_text(), path.name, max_states=MAX_STATES)
    assert tables.n_states <= MAX_STATES
    assert lint_grammar(path) == []
    compile_grammar(path, smol_info).matcher().allowed()


def test_shift_reduce_conflicts_are_errors():
    with pytest.raises(GrammarError, match="not LALR"):
        build_tables('start: a | b\na: "x" "y"\nb: "x" "y"\n')
    with pytest.raises(GrammarError, match="Shift/Reduce"):
        build_tables('start: e\ne: e "+" e | "1"\n')


def test_escaped_string_look_behind_is_refused():
    with pytest.raises(GrammarError, match="look-behind"):
        build_tables("start: ESCAPED_STRING\n%import common.ESCAPED_STRING\n")


def test_state_count_is_bounded():
    items = " ".join(f'"k{i}"?' for i in range(14))
    with pytest.raises(GrammarError, match="LALR states"):
        build_tables(f"start: {items}\n", max_states=2000)


def test_syntax_errors_name_the_line():
    with pytest.raises(GrammarError, match="line 2"):
        build_tables('start: "a"\nbad rule here ::\n', "my.lark")


def test_lint_flags_unbounded_ignore_and_colliding_terminals():
    problems = lint_grammar("start: A | B\nA: /[a-z]+/\nB: /[a-c]+/\n%ignore /\\s+/\n")
    assert any("both match" in p for p in problems)
    assert any("unbounded" in p for p in problems)


def test_lint_flags_a_terminal_that_stops_early():
    problems = lint_grammar('start: A | B\nA: /a+/\nB: "ab"\n')
    assert any("could extend" in p for p in problems)


def test_rules_that_never_complete_are_errors():
    with pytest.raises(GrammarError, match="never be completed"):
        build_tables('start: "x" loop\nloop: "y" loop\n')
