"""JSON and tool modes on Gemma 3 270M: its 262k-token vocabulary through the grammar engine, its own chat
format (the built-in Gemma template) and its end-of-turn token ending a constrained reply."""

from __future__ import annotations

import json

import jsonschema
import pytest

from radixchat.chat.backend import grammar_for
from radixchat.chat.local import LocalBackend
from radixchat.chat.modes import ConstraintSpec
from radixchat.engine import Engine, EngineConfig, SamplingParams
from radixchat.tool_format import tool_call_dicts

pytestmark = pytest.mark.gemma

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture
async def backend(gemma):
    engine = Engine(gemma[0], EngineConfig(kv_pool_tokens=4096, debug=True))
    await engine.start()
    yield LocalBackend(engine)
    await engine.stop()
    engine.core.check_integrity()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
async def test_json_replies_are_valid_with_a_262k_vocabulary(backend, temperature):
    assert backend.fmt.template_name == "gemma" and backend.notices
    assert backend.engine.loaded.vocab_size > 262_000
    conv = backend.new_conversation(system="You answer in JSON.")
    conv.add_user("Give me an example person.")
    grammar = grammar_for(backend, ConstraintSpec("json", PERSON))
    result = await backend.reply(
        conv, SamplingParams(max_tokens=60, temperature=temperature, seed=3), grammar
    ).result()
    assert result.finish_reason == "stop", result.message.content
    jsonschema.validate(json.loads(result.message.content), PERSON)
    # The next turn extends the reply's exact ids (its end of turn comes with the delta), and they stand for
    # the text a full rendering gives.
    before = conv.ids
    ids = conv.add_user("Another one.")
    assert ids[: len(before)] == before and conv.full_renders == 0
    assert backend.fmt.decode(ids) == backend.fmt.render(conv.messages, add_generation_prompt=True)


async def test_a_tool_call_with_a_262k_vocabulary(backend):
    tool = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    }
    conv = backend.new_conversation(tools=[tool])
    conv.add_user("What is the weather in Paris?")
    spec = ConstraintSpec("tool", tools=[tool], tool_choice="required")
    result = await backend.reply(conv, SamplingParams(max_tokens=60), grammar_for(backend, spec)).result()
    assert result.finish_reason == "stop", result.message.content
    calls = tool_call_dicts(result.message.content)
    assert calls and calls[0]["name"] == "get_weather" and isinstance(calls[0]["arguments"]["city"], str)
