"""Bad input keeps its contract: one GrammarError line naming what and where, and compiling always ends
in bounded work — bounded by counted limits or a deadline, tested by the error, never by a duration."""

from __future__ import annotations

import random

import numpy as np
import pytest

from radixchat.grammar import GrammarError, RunCache, compile_grammar, compile_json_schema, compiler
from radixchat.grammar.lexer_space import DEAD, SPACE
from radixchat.grammar.schema import lark_text
from radixchat.grammar.vocab_runs import lex_run, walk_run


def test_a_compile_past_its_deadline_is_refused_with_one_line(smol_info):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    with pytest.raises(GrammarError, match=r"^schema: too complex to compile within 0 s \(near #\)$"):
        compile_json_schema(schema, smol_info, cache=False, max_seconds=0)


def test_a_schema_needing_too_many_rules_is_refused_at_its_pointer(smol_info, monkeypatch):
    monkeypatch.setattr(lark_text, "MAX_RULES", 20)
    props = {f"p{i}": {"type": "object", "properties": {"x": {"type": "integer"}}} for i in range(30)}
    with pytest.raises(
        GrammarError, match=r"schema near #/properties/p\d+: too large \(over 20 grammar rules\)"
    ):
        compile_json_schema({"type": "object", "properties": props}, smol_info, cache=False)


def test_an_explosively_ambiguous_grammar_fails_that_output_only(smol_info):
    """``s: s s | "x"`` has a parse per split of the input; past MAX_FORKS parses at once the output
    fails with a GrammarError (the engine then fails that request alone) instead of slowing down."""
    g = compile_grammar('start: s\ns: s s | "x"\n', smol_info, glr=True)
    m = g.matcher()
    m.advance_bytes(b"x" * 8)
    assert len(m.configs) > 1
    with pytest.raises(GrammarError, match="too ambiguous"):
        m.advance_bytes(b"x" * 1000)


def test_the_prefix_walk_gives_the_vectorised_run(smol_info, smol_tokenizer):
    """Narrow lexer states walk the sorted vocabulary; the result must equal the plain vectorised run."""
    schema = {
        "type": "object",
        "properties": {
            "placementId": {"type": "string", "maxLength": 5},
            "publisher": {"enum": ["abc", "abd", 12]},
            "n": {"type": "number", "minimum": 3},
            "when": {"type": "string", "format": "date-time"},
        },
    }
    g = compile_json_schema(schema, smol_info, cache=False)
    rng = random.Random(0)
    states = set()
    for _ in range(20):
        m = g.matcher()
        for _ in range(40):
            states.update(lx for _, lx in m.configs)
            tid = int(rng.choice(np.flatnonzero(m.allowed().numpy()).tolist()))
            if tid in smol_info.eos_ids:
                break
            m.advance(tid)
    info = smol_info
    checked = 0
    for lex in states - {DEAD}:
        a = lex_run(lex, info.text_ids, info.flat, info.starts, info.lens)
        b = walk_run(lex, info.sorted_bytes, info.sorted_ids, info.flat, info.starts, info.lens)
        assert dict(zip(a.inside_ids.tolist(), a.inside_final.tolist())) == dict(
            zip(b.inside_ids.tolist(), b.inside_final.tolist())
        )

        def crossing(r):
            return {(p, i, o) for p, ids, offs in r.cross for i, o in zip(ids.tolist(), offs.tolist())}

        assert crossing(a) == crossing(b)
        checked += 1
    assert checked > 30 and any(len(SPACE.comps[s]) > 1 for s in states)


def test_running_states_ahead_never_fails_a_compile_past_its_deadline(smol_info, smol_tokenizer, monkeypatch):
    """The states a compile runs ahead of the masks are work the masks would do anyway: past the
    deadline the compile stops running them and succeeds, and the masks compute them."""
    monkeypatch.setattr(compiler, "past_deadline", lambda: True)
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^[g-k]{2}vq$"}}}
    g = compile_json_schema(schema, smol_info, cache=False)
    m = g.matcher()
    m.advance_bytes(b'{"s":"')
    assert m.lex not in RunCache.of(smol_info)._runs  # not run ahead
    mask = m.allowed().numpy()
    assert (
        mask[smol_tokenizer.convert_tokens_to_ids("g")]
        and not mask[smol_tokenizer.convert_tokens_to_ids("a")]
    )
    m.advance_bytes(b'gkvq"}')
    assert m.is_accepting()
