"""Tools: the calculator's safety, built-ins, user tools (consent, limits), and tool mode end to end."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import jsonschema
import pytest
import torch

from radixchat.chat.conversation import ChatFormat, Conversation
from radixchat.chat.local import LocalBackend
from radixchat.chat.tool_turn import run_tool_turn
from radixchat.chat.tools import (
    ToolContext,
    ToolError,
    ToolRegistry,
    allow_listed,
    calculate,
    deny_all,
)
from radixchat.config import UserToolConfig
from radixchat.engine import Engine, EngineConfig, SamplingParams
from radixchat.engine.loader import describe_model
from radixchat.errors import RadixchatError
from radixchat.grammar import parse_tool_calls
from tests.conftest import build_pair

# -- the calculator ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1+2*3", 7),
        ("2**10", 1024),
        ("(1.5+2)/4", 0.875),
        ("7//2", 3),
        ("-3%5", 2),
        ("-(2**3)", -8),
        ("1e3", 1000.0),
    ],
)
def test_calculator_does_arithmetic(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("__import__('os').system('true')", "function call"),
        ("(1).__class__", "attribute access"),
        ("x + 1", "a name"),
        ("9**9**9", "too large"),
        ("10**100000", "too large"),
        ("2**5000", "too large"),
        ("1e308*10", "too large"),
        ("'a'*3", "only numbers"),
        ("True+1", "only numbers"),
        ("[1][0]", "Subscript"),
        ("1 if 1 else 2", "IfExp"),
        ("1/0", "division by zero"),
        ("(-8)**0.5", "not a real number"),
        ("1+" * 500 + "1", "longer than"),
        ("lambda: 1", "Lambda"),
        ("1; 2", "not an arithmetic expression"),
    ],
)
def test_calculator_rejects_everything_but_arithmetic(expr, message):
    with pytest.raises(ToolError, match=message):
        calculate(expr)


# -- the registry and built-ins ----------------------------------------------------------------------------


async def test_calculator_error_becomes_a_result_not_an_exception():
    rec = await ToolRegistry().call("calculator", {"expression": "a.b"}, ToolContext(), deny_all)
    assert rec.result is None and "attribute access" in rec.error
    assert rec.message_content().startswith("error: ")


async def test_invalid_arguments_are_refused_before_running():
    rec = await ToolRegistry().call("calculator", {"expr": "1+1"}, ToolContext(), deny_all)
    assert "invalid arguments" in rec.error


async def test_unknown_tool_is_an_error_result():
    rec = await ToolRegistry().call("rm_rf", {}, ToolContext(), deny_all)
    assert "unknown tool" in rec.error


async def test_now_with_and_without_a_time_zone():
    reg, ctx = ToolRegistry(), ToolContext()
    assert "UTC" in (await reg.call("now", {}, ctx, deny_all)).result
    assert "Asia/Tokyo" in (await reg.call("now", {"timezone": "Asia/Tokyo"}, ctx, deny_all)).result
    assert (
        await reg.call("now", {"timezone": "Mars/Base"}, ctx, deny_all)
    ).error == "invalid argument 'timezone': 'Mars/Base' is not one of the allowed values"


async def test_session_notes_round_trip():
    reg, ctx = ToolRegistry(), ToolContext()
    await reg.call("write_session_notes", {"text": "buy milk"}, ctx, deny_all)
    await reg.call("write_session_notes", {"text": "; eggs", "mode": "append"}, ctx, deny_all)
    assert (await reg.call("read_session_notes", {}, ctx, deny_all)).result == "buy milk; eggs"
    assert ctx.notes == "buy milk; eggs"


def test_select_unknown_tool_and_name_clash():
    with pytest.raises(RadixchatError, match="unknown tool 'nope'"):
        ToolRegistry().select(["nope"])
    with pytest.raises(RadixchatError, match="clashes with a built-in"):
        ToolRegistry.from_config([UserToolConfig(name="calculator", command="true")])


# -- user tools --------------------------------------------------------------------------------------------


def py_tool(tmp_path: Path, body: str, **kw) -> UserToolConfig:
    script = tmp_path / "tool.py"
    script.write_text("import json, sys, time\nargs = json.load(sys.stdin)\n" + body)
    params = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}
    return UserToolConfig(name="mytool", command=[sys.executable, str(script)], parameters=params, **kw)


async def call_user(cfg: UserToolConfig, consent=None, args=None):
    reg = ToolRegistry.from_config([cfg])
    return await reg.call("mytool", args or {"x": "hi"}, ToolContext(), consent or allow_listed({"mytool"}))


async def test_user_tool_gets_arguments_on_stdin(tmp_path):
    rec = await call_user(py_tool(tmp_path, "print('got ' + args['x'])"))
    assert rec.error is None and rec.result == "got hi"


async def test_user_tool_never_runs_without_consent(tmp_path):
    marker = tmp_path / "ran"
    cfg = py_tool(tmp_path, f"open({str(marker)!r}, 'w').write('x')\nprint('ok')")
    rec = await call_user(cfg, consent=deny_all)
    assert "did not allow" in rec.error and not marker.exists()
    rec = await call_user(cfg, consent=allow_listed({"othertool"}))
    assert "did not allow" in rec.error and not marker.exists()
    rec = await call_user(cfg)
    assert rec.result == "ok" and marker.exists()


async def test_user_tool_timeout(tmp_path):
    rec = await call_user(py_tool(tmp_path, "time.sleep(30)", timeout_s=0.5))
    assert "timed out after 0.5 s" in rec.error and rec.duration_ms < 10_000


async def test_user_tool_nonzero_exit(tmp_path):
    rec = await call_user(py_tool(tmp_path, "sys.stderr.write('bad input\\n'); sys.exit(3)"))
    assert rec.error == "exited with status 3: bad input"


async def test_user_tool_oversized_output(tmp_path):
    rec = await call_user(py_tool(tmp_path, "print('x' * 100000)", max_output_bytes=1000))
    assert "exceeded 1000 bytes" in rec.error


async def test_user_tool_malformed_json_output(tmp_path):
    rec = await call_user(py_tool(tmp_path, "print('{not json')", output="json"))
    assert "not valid JSON" in rec.error
    rec = await call_user(py_tool(tmp_path, "print(json.dumps({'echo': args['x']}))", output="json"))
    assert rec.result == '{"echo": "hi"}'


async def test_user_tool_missing_program(tmp_path):
    cfg = UserToolConfig(name="mytool", command=[str(tmp_path / "nope")])
    rec = await ToolRegistry.from_config([cfg]).call("mytool", {}, ToolContext(), allow_listed({"mytool"}))
    assert "cannot start" in rec.error


# -- prompt rendering --------------------------------------------------------------------------------------


def test_tools_go_into_the_system_prompt_for_templates_without_tool_support(smol_tokenizer):
    fmt = ChatFormat(smol_tokenizer)
    assert not fmt.native_tools
    conv = Conversation(
        fmt, system="Be brief.", tools=[t.schema() for t in ToolRegistry().select(["calculator"])]
    )
    conv.add_user("2+2?")
    assert (
        "calculator" in conv.text
        and "<tool_call>" in conv.text
        and conv.text.count("<|im_start|>system") == 1
    )


# -- tool mode end to end ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_full_vocab_model(smol_tokenizer):
    """A tiny random Llama with SmolLM2's whole vocabulary: a 'fake model' that samples anything."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=None,
    )
    model, _ = build_pair(cfg)
    return describe_model(model, smol_tokenizer, "tiny-random-49k", Path("."))


async def run_turns(loaded, choice, n, temperature=1.0, max_tokens=120, max_calls=1):
    engine = Engine(loaded, EngineConfig(kv_pool_tokens=8192))
    reg = ToolRegistry()
    tools = reg.select(None)
    decl_names = {t.name for t in tools}
    out = []
    async with engine:
        backend = LocalBackend(engine)
        for seed in range(n):
            conv = backend.new_conversation(system="You can use tools.")
            turn = await run_tool_turn(
                backend,
                conv,
                "What is 17*23? Use a tool.",
                SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
                tools,
                reg,
                ToolContext(),
                deny_all,
                tool_choice=choice,
                max_rounds=1,
                max_calls=max_calls,
            )
            out.append((turn, decl_names, reg))
    engine.core.check_integrity()
    return out


def assert_valid_call_round(result, decl_names, reg):
    parsed = parse_tool_calls(result.message.content)
    assert parsed.calls, f"no call in {result.message.content!r}"
    for call in parsed.calls:
        assert call["name"] in decl_names
        jsonschema.validate(call["arguments"], reg.tools[call["name"]].parameters)
    return parsed


async def test_fake_model_required_always_calls_a_declared_tool(random_full_vocab_model):
    for turn, names, reg in await run_turns(random_full_vocab_model, "required", 4):
        first = turn.rounds[0]
        if first.finish_reason == "stop":
            assert_valid_call_round(first, names, reg)
        else:  # ran out of budget: never executed
            assert first.finish_reason == "length" and not turn.calls


async def test_fake_model_none_never_calls(random_full_vocab_model):
    for turn, _, _ in await run_turns(random_full_vocab_model, "none", 4, max_tokens=40):
        assert not turn.calls and "<tool_call>" not in turn.final.message.content


async def test_text_cut_by_the_token_budget_is_length_not_stop(random_full_vocab_model):
    """The grammar closes the output with EOS when the budget runs out; that is a cut, not a stop."""
    for turn, _, _ in await run_turns(random_full_vocab_model, "none", 3, max_tokens=12):
        final = turn.final
        assert final.finish_reason == "length" and final.completion_tokens == 12, final.message.content


@pytest.mark.real_model
async def test_real_model_named_tool_call_parses_validates_and_runs(smol):
    results = await run_turns(smol[0], {"name": "calculator"}, 1, temperature=0.0)
    for turn, _, reg in results:
        assert_valid_call_round(turn.rounds[0], {"calculator"}, reg)
        assert turn.calls and turn.calls[0].name == "calculator"
        assert len(turn.rounds) == 2  # the call, then the answer with the result


@pytest.mark.real_model
async def test_real_model_required_and_none(smol):
    for turn, names, reg in await run_turns(smol[0], "required", 2, temperature=0.7):
        if turn.rounds[0].finish_reason == "stop":
            assert_valid_call_round(turn.rounds[0], names, reg)
    for turn, _, _ in await run_turns(smol[0], "none", 2, temperature=0.7, max_tokens=40):
        assert not turn.calls


@pytest.mark.real_model
async def test_real_model_parallel_calls_end_with_a_complete_block_when_the_budget_is_short(smol):
    """Greedy, the model repeats its call block while it may. At 100 tokens, a second block would have
    had only its shortest completion left (measured before the rule: ``read_session_notes`` with ``{}``,
    which runs); the reply must end after the first block instead. At 200 the second one is written."""
    ((short, names, reg),) = await run_turns(smol[0], "required", 1, 0.0, max_tokens=100, max_calls=4)
    first = short.rounds[0]
    parsed = assert_valid_call_round(first, names, reg)
    assert first.finish_reason == "stop" and len(parsed.calls) == 1, first.message.content
    assert first.message.content.rstrip().endswith("</tool_call>") and not short.notes
    ((long, _, _),) = await run_turns(smol[0], "required", 1, 0.0, max_tokens=200, max_calls=4)
    assert long.rounds[0].message.content.count("</tool_call>") >= 2, long.rounds[0].message.content
    assert long.rounds[0].message.content.startswith(first.message.content.rstrip())


@pytest.mark.real_model
async def test_each_tool_round_reuses_everything_before_it(smol):
    engine = Engine(smol[0], EngineConfig(kv_pool_tokens=8192))
    reg = ToolRegistry()
    async with engine:
        backend = LocalBackend(engine)
        conv = backend.new_conversation(system="You can use tools.")
        params = SamplingParams(max_tokens=60, temperature=0.0)
        turns = []
        for question, choice in [
            ("Compute 12*12 with the calculator.", {"name": "calculator"}),
            ("And 3+4?", {"name": "calculator"}),
        ]:
            turns.append(
                await run_tool_turn(
                    backend,
                    conv,
                    question,
                    params,
                    reg.select(["calculator"]),
                    reg,
                    ToolContext(),
                    deny_all,
                    tool_choice=choice,
                    max_rounds=2,
                )
            )
    rounds = [r for t in turns for r in t.rounds]
    assert len(rounds) >= 4 and any(t.calls for t in turns)
    for prev, cur in zip(rounds, rounds[1:]):
        assert cur.cached_tokens >= prev.prompt_tokens + prev.completion_tokens - 1
    assert conv.full_renders == 0
    assert [m.role for m in conv.messages].count("tool") == sum(len(t.calls) for t in turns)
    engine.core.check_integrity()
    await asyncio.sleep(0)
    assert torch.is_grad_enabled()  # the engine thread's no-grad setting does not leak into the loop


async def test_cancelling_a_running_user_tool_kills_its_process(tmp_path):
    import os

    pidfile = tmp_path / "pid"
    cfg = py_tool(
        tmp_path,
        f"import os\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)",
        timeout_s=120,
    )
    task = asyncio.ensure_future(call_user(cfg))
    for _ in range(200):
        if pidfile.exists() and pidfile.read_text():
            break
        await asyncio.sleep(0.05)
    pid = int(pidfile.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.real_model
async def test_should_continue_stops_before_the_next_round(smol):
    engine = Engine(smol[0], EngineConfig(kv_pool_tokens=4096))
    reg = ToolRegistry()
    async with engine:
        backend = LocalBackend(engine)
        conv = backend.new_conversation()
        turn = await run_tool_turn(
            backend,
            conv,
            "Compute 2+2.",
            SamplingParams(max_tokens=60),
            reg.select(["calculator"]),
            reg,
            ToolContext(),
            deny_all,
            tool_choice={"name": "calculator"},
            should_continue=lambda: False,
        )
    assert len(turn.rounds) == 1 and turn.calls  # the call ran, its result is in, no second reply
    assert conv.messages[-1].role == "tool"


def test_a_user_tool_with_a_broken_grammar_is_left_out_and_named():
    from radixchat.chat.tools import ToolRegistry
    from radixchat.config import UserToolConfig

    bad = {"type": "object", "properties": {"q": {"type": "string", "x-grammar": "start: NOPE"}}}
    good = {"type": "object", "properties": {}}
    reg = ToolRegistry.from_config(
        [
            UserToolConfig(name="broken", description="", command=["true"], parameters=bad),
            UserToolConfig(name="fine", description="", command=["true"], parameters=good),
        ]
    )
    assert "fine" in reg.tools and "broken" not in reg.tools
    assert reg.problems and reg.problems[0].startswith("tool 'broken': x-grammar at #/properties/q")
