"""The remote backend against a real OpenAI-compatible server on loopback: llama-cpp-python's server with
the bundled SmolLM2 GGUF. Skipped (with the reason) where llama-cpp-python[server] is not installed;
``.ci/run`` installs it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from radixchat.chat.backend import grammar_for
from radixchat.chat.modes import ConstraintSpec
from radixchat.chat.remote import RemoteBackend
from radixchat.engine import SamplingParams
from tests.remote.conftest import SERVED_ALIAS

pytestmark = pytest.mark.remote_server

RADIXCHAT = shutil.which("radixchat") or str(Path(sys.executable).with_name("radixchat"))
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}


@pytest.fixture
async def real(llama_server):
    backend = RemoteBackend(llama_server, SERVED_ALIAS, timeout_s=60.0)
    yield backend
    await backend.aclose()


async def test_a_reply_streams_in_deltas_from_a_real_server(real):
    conv = real.new_conversation(system="You are a concise assistant.")
    conv.add_user("Name three colours.")
    reply = real.reply(conv, GREEDY)
    deltas = [d async for d in reply]
    result = await reply.result()
    assert result.finish_reason in ("stop", "length"), result.error
    assert len(deltas) > 1 and result.message.content == "".join(deltas) != ""
    assert result.completion_tokens >= 1 and result.ttft_ms is not None and result.ttft_ms > 0
    assert result.message.token_ids == [] and conv.messages[-1] is result.message


async def test_multi_turn_sends_the_history(real):
    alone = real.new_conversation()
    alone.add_user("What did I just tell you?")
    without = await real.reply(alone, GREEDY).result()
    conv = real.new_conversation()
    conv.add_user("My favourite animal is the red panda. Remember it.")
    await real.reply(conv, GREEDY).result()
    conv.add_user("What did I just tell you?")
    second = await real.reply(conv, GREEDY).result()
    assert second.finish_reason in ("stop", "length") and second.message.content
    assert [m.role for m in conv.messages] == ["user", "assistant", "user", "assistant"]
    # Greedy decoding of the same question: only the earlier turns can make the answers differ.
    assert second.message.content != without.message.content


async def test_json_mode_gives_schema_valid_json_on_a_real_server(real):
    conv = real.new_conversation(system="Answer in JSON.")
    conv.add_user("Describe the weather in Paris today.")
    grammar = grammar_for(real, ConstraintSpec("json", SCHEMA))
    result = await real.reply(conv, SamplingParams(max_tokens=64, temperature=0.0), grammar).result()
    assert result.finish_reason == "stop", result.error
    jsonschema.validate(json.loads(result.message.content), SCHEMA)


async def test_cancel_stops_a_real_reply_and_the_server_serves_the_next(real):
    conv = real.new_conversation()
    conv.add_user("Write a long story about a lighthouse keeper.")
    reply = real.reply(conv, SamplingParams(max_tokens=400, temperature=0.0))
    seen = []
    async for delta in reply:
        seen.append(delta)
        if len(seen) == 3:
            reply.cancel()
    result = await reply.result()
    assert result.finish_reason == "cancelled" and result.message.content == "".join(seen)
    conv.add_user("Thanks.")
    after = await real.reply(conv, GREEDY).result()
    assert after.finish_reason in ("stop", "length") and after.message.content


async def test_the_servers_only_model_is_found_without_naming_it(llama_server):
    backend = RemoteBackend(llama_server, "smollm2")
    assert await backend.list_models() == [SERVED_ALIAS]
    assert await backend.resolve_model(explicit=False) == SERVED_ALIAS


def test_batch_mode_end_to_end_on_a_real_server(llama_server, tmp_path):
    rows = [
        {
            "id": "a",
            "system": "Be brief.",
            "turns": ["What is the sun?", "Say it shorter."],
            "max_tokens": 16,
        },
        {"id": "b", "turns": ["What is rain?"], "max_tokens": 16},
        {"id": "j", "turns": ["The weather in Rome?"], "mode": "json", "schema": SCHEMA, "max_tokens": 64},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run(
        [RADIXCHAT, "--backend", llama_server, "--batch", str(path), "--ordered"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RADIXCHAT_TEMPERATURE": "0"},
    )
    assert proc.returncode == 0, proc.stderr
    recs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["id"], r["turn"]) for r in recs] == [("a", 0), ("a", 1), ("b", 0), ("j", 0)]
    for r in recs:
        assert r["error"] is None and r["finish_reason"] in ("stop", "length") and r["reply"]
        assert r["usage"]["completion_tokens"] >= 1 and r["ttft_ms"] > 0
    jsonschema.validate(json.loads(recs[3]["reply"]), SCHEMA)
    assert "3 conversations, 4 turns" in proc.stderr


def test_list_models_on_a_real_server(llama_server):
    proc = subprocess.run(
        [RADIXCHAT, "--backend", llama_server, "--list-models"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [SERVED_ALIAS]
