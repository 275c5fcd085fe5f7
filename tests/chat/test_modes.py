"""JSON mode through the real engine: every reply that ends with EOS is valid JSON for its schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixchat.chat.backend import ChatBackend, grammar_for
from radixchat.chat.local import LocalBackend
from radixchat.chat.modes import ConstraintSpec, ModeError
from radixchat.engine import Engine, EngineConfig, SamplingParams

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
    },
    "enum_and_array": {
        "type": "object",
        "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "tags": {
                "type": "array",
                "items": {"type": "string", "maxLength": 12},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["colour", "tags"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "location": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
            },
            "capital": {"type": "boolean"},
        },
        "required": ["city", "location", "capital"],
    },
    "any_json": None,
}


@pytest.fixture
async def backend(smol):
    engine = Engine(smol[0], EngineConfig(kv_pool_tokens=8192, debug=True))
    await engine.start()
    yield LocalBackend(engine)
    await engine.stop()
    engine.core.check_integrity()


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_json_mode_replies_are_valid_for_their_schema(backend, name, temperature):
    schema = SCHEMAS[name]
    conv = backend.new_conversation(system="You answer in JSON.")
    conv.add_user(f"Give me an example object ({name.replace('_', ' ')}).")
    grammar = grammar_for(backend, ConstraintSpec("json", schema))
    params = SamplingParams(max_tokens=80, temperature=temperature, seed=7)
    result = await backend.reply(conv, params, grammar).result()
    assert result.finish_reason == "stop", result.message.content
    value = json.loads(result.message.content)
    if schema is None:
        assert isinstance(value, dict)
    else:
        jsonschema.validate(value, schema)


@pytest.mark.real_model
async def test_json_mode_steers_to_completion_within_a_small_budget(backend):
    conv = backend.new_conversation()
    conv.add_user("List as many fruits as you can, as a JSON object with a 'fruits' array.")
    schema = {
        "type": "object",
        "properties": {"fruits": {"type": "array", "items": {"type": "string"}}},
        "required": ["fruits"],
    }
    result = await backend.reply(
        conv, SamplingParams(max_tokens=24), grammar_for(backend, ConstraintSpec("json", schema))
    ).result()
    assert result.completion_tokens <= 24
    assert result.finish_reason == "stop", "the grammar should close the JSON before the budget runs out"
    jsonschema.validate(json.loads(result.message.content), schema)


@pytest.mark.real_model
async def test_second_json_turn_reuses_the_first(backend):
    conv = backend.new_conversation()
    g = lambda: grammar_for(backend, ConstraintSpec("json", SCHEMAS["person"]))  # noqa: E731
    conv.add_user("A person named Ada.")
    first = await backend.reply(conv, SamplingParams(max_tokens=40), g()).result()
    conv.add_user("Now one named Alan.")
    second = await backend.reply(conv, SamplingParams(max_tokens=40), g()).result()
    assert second.cached_tokens >= first.prompt_tokens + first.completion_tokens - 1


def test_chat_mode_is_unconstrained():
    assert grammar_for(object(), ConstraintSpec("chat")) is None


@pytest.mark.real_model
async def test_unsupported_schema_is_a_mode_error(backend):
    with pytest.raises(ModeError, match="'not'"):
        grammar_for(backend, ConstraintSpec("json", {"not": {"type": "string"}}))


class NoConstraints(ChatBackend):
    """A backend that declares no constraints of its own (the protocol's default)."""

    model_name = "none"

    async def aclose(self) -> None: ...
    def new_conversation(self, system=None, tools=None): ...
    def reply(self, conv, params, constraint=None): ...
    def totals(self): ...


def test_backend_without_constraints_refuses_json_mode():
    with pytest.raises(ModeError, match="not available"):
        grammar_for(NoConstraints(), ConstraintSpec("json"))
    with pytest.raises(ModeError, match="unknown mode 'yaml'"):
        grammar_for(NoConstraints(), ConstraintSpec("yaml"))


def test_the_mask_cache_is_saved_and_reused_across_runs(smol_tokenizer, tmp_path):
    from radixchat.chat.local import GrammarService
    from radixchat.grammar import RunCache

    first = GrammarService(smol_tokenizer, 49152, frozenset({2}), cache_dir=tmp_path)
    matcher = first.matcher(ConstraintSpec("json", SCHEMAS["person"]))
    for tid in smol_tokenizer.encode('{"name": "Ada", "age": 36}', add_special_tokens=False):
        matcher.allowed()
        matcher.advance(tid)
    learned = RunCache.of(first.info).cached_states
    first.save()
    (saved,) = (tmp_path / "grammar").glob("masks-*.npz")
    second = GrammarService(smol_tokenizer, 49152, frozenset({2}), cache_dir=tmp_path)
    assert RunCache.of(second.info).cached_states == learned > 0
    saved.write_bytes(b"garbage")  # a damaged cache is ignored, not fatal
    third = GrammarService(smol_tokenizer, 49152, frozenset({2}), cache_dir=tmp_path)
    assert RunCache.of(third.info).cached_states == 0
    assert third.matcher(ConstraintSpec("json")).allowed().any()
