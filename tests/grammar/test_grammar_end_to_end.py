"""JSON mode on the default model (SmolLM2-135M-Instruct): replies are json.loads-valid and
schema-valid, greedy and with temperature 1.0 sampling."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from radixchat.grammar import TokenizerInfo, compile_json_schema, compile_tool_call_grammar, parse_tool_calls
from radixchat.grammar.hf import GrammarLogitsProcessor, generate

pytestmark = pytest.mark.real_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}
COLOURS = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3}
EVENT = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 16},
        "date": {"type": "string", "format": "date"},
        "online": {"type": "boolean"},
    },
    "required": ["title", "date", "online"],
}


def _generate(
    model, tokenizer, info, grammar, prompt: str, temperature: float, max_new_tokens: int, seed: int = 0
):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt"
    )
    if not torch.is_tensor(ids):
        ids = ids["input_ids"]
    gen = generate(
        model,
        ids,
        grammar.matcher(),
        max_new_tokens=max_new_tokens,
        eos_ids=info.eos_ids,
        temperature=temperature,
        generator=torch.Generator().manual_seed(seed),
    )
    assert gen[-1] in info.eos_ids, "the grammar steered the reply to completion within max_new_tokens"
    return tokenizer.decode(gen[:-1])


@pytest.fixture(scope="module")
def model_info(smol_model, smol_tokenizer):
    return TokenizerInfo.from_tokenizer(smol_tokenizer, vocab_size=smol_model.config.vocab_size)


@pytest.mark.parametrize(
    "schema, prompt, temperature",
    [
        (PERSON, "Describe a person as JSON with a name and an age.", 0.0),
        (COLOURS, "List two colours as a JSON array.", 0.0),
        (EVENT, "Give a JSON event: a title, a date and whether it is online.", 1.0),
        (PERSON, "Describe a person as JSON with a name and an age.", 1.0),
    ],
)
def test_json_mode_replies_validate(smol_model, smol_tokenizer, model_info, schema, prompt, temperature):
    g = compile_json_schema(schema, model_info)
    text = _generate(smol_model, smol_tokenizer, model_info, g, prompt, temperature, max_new_tokens=40)
    value = json.loads(text)
    cls = jsonschema.Draft202012Validator
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)


def test_logits_processor_with_hf_generate(smol_model, smol_tokenizer, model_info):
    from transformers import LogitsProcessorList

    g = compile_json_schema(COLOURS, model_info)
    ids = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Two colours as JSON."}], add_generation_prompt=True, return_tensors="pt"
    )
    if not torch.is_tensor(ids):
        ids = ids["input_ids"]
    proc = GrammarLogitsProcessor(g.matcher(), ids.shape[1], 16)
    out = smol_model.generate(
        ids,
        max_new_tokens=16,
        do_sample=False,
        logits_processor=LogitsProcessorList([proc]),
        eos_token_id=list(model_info.eos_ids),
        pad_token_id=model_info.eos_ids[0],
    )
    text = smol_tokenizer.decode([t for t in out[0, ids.shape[1] :].tolist() if t not in model_info.eos_ids])
    jsonschema.validate(json.loads(text), COLOURS)


def test_required_tool_call_is_well_formed(smol_model, smol_tokenizer, model_info):
    tools = [
        {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 20}},
                "required": ["city"],
            },
        }
    ]
    g = compile_tool_call_grammar(tools, model_info, "required")
    text = _generate(smol_model, smol_tokenizer, model_info, g, "What is the weather in Paris?", 0.0, 48)
    calls = parse_tool_calls(text).calls
    assert calls and calls[0]["name"] == "get_weather" and isinstance(calls[0]["arguments"]["city"], str)
