"""RemoteBackend against a scripted fake server: the request it sends, the reply it builds, and every
failure a real server cannot be made to produce on demand."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from radixchat.chat.backend import TurnResult, grammar_for
from radixchat.chat.modes import ConstraintSpec, ModeError
from radixchat.chat.remote import BackendUnavailableError, RemoteBackend, request_messages
from radixchat.chat.tool_turn import run_tool_turn
from radixchat.chat.tools import ToolContext, ToolRegistry, allow_listed
from radixchat.engine import SamplingParams
from tests.remote.fake_server import Status, Stream

PARAMS = SamplingParams(max_tokens=16, temperature=0.0)


async def ask(backend: RemoteBackend, text: str = "Hi", conv=None, grammar=None) -> TurnResult:
    conv = conv if conv is not None else backend.new_conversation(system="Be brief.")
    conv.add_user(text)
    return await backend.reply(conv, PARAMS, grammar).result()


# -- the happy path ---------------------------------------------------------------------------------------


async def test_reply_streams_deltas_and_appends_the_message_without_token_ids(make_backend):
    backend = make_backend()
    conv = backend.new_conversation(system="Be brief.")
    conv.add_user("Hi")
    reply = backend.reply(conv, PARAMS)
    deltas = [d async for d in reply]
    result = await reply.result()
    assert deltas == ["Hello", " there", "!"]
    assert result.finish_reason == "stop" and result.error is None
    assert conv.messages[-1] is result.message
    assert result.message.content == "Hello there!" and result.message.token_ids == []
    assert conv.ids == [] and conv.full_renders == 0


async def test_request_carries_history_sampling_and_asks_for_usage(make_backend, fake):
    backend = make_backend()
    conv = backend.new_conversation(system="Be brief.")
    await ask(backend, "Hi", conv)
    params = SamplingParams(
        max_tokens=7, temperature=0.5, top_p=0.9, top_k=20, repetition_penalty=1.1, seed=3, stop=("END",)
    )
    conv.add_user("Again")
    await backend.reply(conv, params).result()
    body = fake.chat_requests[-1]["body"]
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert [(m["role"], m["content"]) for m in body["messages"]] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello there!"),
        ("user", "Again"),
    ]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (7, 0.5, 0.9, 3)
    assert body["stop"] == ["END"] and body["top_k"] == 20 and body["repetition_penalty"] == 1.1


async def test_usage_with_cached_tokens_fills_the_footer(make_backend):
    backend = make_backend()
    result = await ask(backend)
    assert (result.prompt_tokens, result.cached_tokens, result.completion_tokens) == (20, 12, 3)
    assert result.ttft_ms is not None and result.ttft_ms > 0
    assert result.footer().startswith("reused 12 · prefilled 8 · TTFT ")
    assert result.message.meta["usage"] == {"prompt_tokens": 20, "cached_tokens": 12, "completion_tokens": 3}
    assert backend.totals().hit_rate == pytest.approx(12 / 20)


async def test_a_server_that_reports_no_usage_leaves_prompt_and_cache_unknown(make_backend, fake):
    fake.default = Stream(deltas=["a", "b", "c", "d"], usage=None)
    backend = make_backend()
    result = await ask(backend)
    assert (result.prompt_tokens, result.cached_tokens) == (None, None)
    assert result.completion_tokens == 4  # counted from the streamed chunks
    assert result.usage() == {"prompt_tokens": None, "cached_tokens": None, "completion_tokens": 4}
    assert "reused" not in result.footer() and "TTFT" in result.footer()
    assert result.message.meta["usage"] == {"completion_tokens": 4}
    assert backend.totals().hit_rate is None


async def test_a_server_that_reports_no_cached_tokens_shows_the_prompt_size(make_backend, fake):
    fake.default = Stream(usage={"prompt_tokens": 30, "completion_tokens": 3})
    result = await ask(make_backend())
    assert result.cached_tokens is None and result.footer().startswith("prompt 30 · TTFT")


async def test_no_engine_behind_a_remote_backend(make_backend):
    backend = make_backend()
    assert backend.stats() is None and backend.cached_path([1, 2]) == []
    backend.warm([1, 2, 3])  # a no-op, not an error
    assert backend.base_url in backend.cache_tree_note and "server" in backend.cache_tree_note


# -- retries, timeouts, broken streams ------------------------------------------------------------------


async def test_429_then_success_is_retried_after_the_servers_retry_after(make_backend, fake):
    fake.script = [Status(429, "slow down", {"retry-after": "0.3"}), Stream()]
    started = time.perf_counter()
    result = await ask(make_backend())
    assert result.finish_reason == "stop" and result.message.content == "Hello there!"
    assert len(fake.chat_requests) == 2
    assert time.perf_counter() - started >= 0.3


async def test_429_every_time_gives_up_after_the_retries(make_backend, fake):
    fake.default = Status(429, "slow down", {"retry-after": "0"})
    result = await ask(make_backend(retries=2))
    assert result.finish_reason == "error" and len(fake.chat_requests) == 3
    assert "429" in result.error and "after 3 tries" in result.error and "slow down" in result.error


async def test_a_dropped_connection_mid_stream_keeps_the_partial_reply_marked(make_backend, fake):
    fake.default = Stream(deltas=["one", " two", " three", " four"], drop_after=2)
    backend = make_backend()
    conv = backend.new_conversation()
    conv.add_user("Count")
    reply = backend.reply(conv, PARAMS)
    deltas = [d async for d in reply]
    result = await reply.result()
    assert deltas == ["one", " two"]
    assert result.finish_reason == "error" and result.message.content == "one two"
    assert "closed the connection mid-reply" in result.error and "partial reply is kept" in result.error
    assert result.message.meta["partial"] is True and result.message.meta["error"] == result.error
    assert conv.messages[-1] is result.message and len(fake.chat_requests) == 1  # never retried after output


async def test_a_stream_that_ends_without_a_finish_reason_is_an_error(make_backend, fake):
    fake.default = Stream(deltas=["half"], finish=None)
    result = await ask(make_backend())
    assert result.finish_reason == "error" and result.message.content == "half"
    assert "ended the stream before the reply was finished" in result.error


async def test_a_dropped_connection_before_the_first_token_is_retried(make_backend, fake):
    fake.script = [Stream(drop_after=0), Stream()]
    result = await ask(make_backend())
    assert result.finish_reason == "stop" and result.message.content == "Hello there!"
    assert len(fake.chat_requests) == 2


async def test_a_stream_cut_before_its_first_token_is_sent_again_once(make_backend, fake):
    # llama-cpp-python's server ends a running stream ("[DONE]", no finish reason) when another request
    # arrives, unless started with --interrupt_requests False.
    fake.script = [Stream(interrupted_after=0), Stream()]
    result = await ask(make_backend(retries=0))  # not one of the retries: those are for failed requests
    assert result.finish_reason == "stop" and result.message.content == "Hello there!"
    assert result.error is None and len(fake.chat_requests) == 2
    assert fake.chat_requests[0]["body"] == fake.chat_requests[1]["body"]  # the same request, sent anew


async def test_a_stream_cut_before_its_first_token_twice_fails_the_turn(make_backend, fake):
    fake.default = Stream(interrupted_after=0)
    result = await ask(make_backend())
    assert result.finish_reason == "error" and result.message.content == ""
    assert "ended the stream before the reply was finished" in result.error
    assert "partial" not in result.message.meta and len(fake.chat_requests) == 2


async def test_a_stream_cut_after_tokens_fails_the_turn_and_keeps_them(make_backend, fake):
    fake.default = Stream(deltas=["one", " two", " three"], interrupted_after=2)
    result = await ask(make_backend())
    assert result.finish_reason == "error" and result.message.content == "one two"
    assert "ended the stream before the reply was finished; the partial reply is kept" in result.error
    assert result.message.meta["partial"] is True and len(fake.chat_requests) == 1


async def test_a_slow_first_token_past_the_timeout_fails_without_retrying(make_backend, fake):
    fake.default = Stream(delay_first=3.0)
    started = time.perf_counter()
    result = await ask(make_backend(timeout_s=0.5, retries=2))
    assert time.perf_counter() - started < 2.5
    assert result.finish_reason == "error" and result.message.content == ""
    assert "within 0.5 s" in result.error and "--remote-timeout" in result.error
    assert len(fake.chat_requests) == 1  # the server has the request: asking again only adds load
    assert "partial" not in result.message.meta


@pytest.mark.parametrize(
    ("code", "expect", "tries"),
    [
        (401, "refused the API key (401 Unauthorized); set $RC_TEST_KEY", 1),
        (404, "404 Not Found: model 'fake-model' is unknown there", 1),
        (400, "rejected the request (400): scripted error", 1),
        (500, "failed with a server error (500) after 3 tries: scripted error", 3),
        (503, "failed with a server error (503) after 3 tries", 3),
    ],
)
async def test_http_errors_give_one_clear_line(make_backend, fake, code, expect, tries):
    fake.default = Status(code)
    result = await ask(make_backend(api_key_env="RC_TEST_KEY"))
    assert result.finish_reason == "error" and expect in result.error
    assert "\n" not in result.error and len(fake.chat_requests) == tries


async def test_an_unreachable_server_is_retried_then_reported(make_backend):
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    result = await ask(make_backend(url=f"http://127.0.0.1:{port}/v1", retries=1))
    assert result.finish_reason == "error" and result.error.startswith(
        f"cannot reach http://127.0.0.1:{port}/v1"
    )
    assert "after 2 tries" in result.error


async def test_the_api_key_comes_from_the_environment_as_a_bearer_token(make_backend, fake):
    await ask(make_backend(api_key="s3cret"))
    assert fake.chat_requests[0]["headers"]["authorization"] == "Bearer s3cret"


# -- cancel ------------------------------------------------------------------------------------------------


async def test_cancel_closes_the_stream_and_keeps_what_arrived(make_backend, fake):
    fake.default = Stream(deltas=[f"w{i} " for i in range(40)], delay_each=0.05)
    backend = make_backend()
    conv = backend.new_conversation()
    conv.add_user("Go on")
    reply = backend.reply(conv, PARAMS)
    seen = []
    async for delta in reply:
        seen.append(delta)
        if len(seen) == 2:
            reply.cancel()
    result = await reply.result()
    assert result.finish_reason == "cancelled" and result.message.content == "".join(seen) == "w0 w1 "
    assert result.error is None and conv.messages[-1] is result.message
    assert await asyncio.to_thread(fake.wait_for_disconnect), "the server never saw the client go"


async def test_cancel_before_the_first_token(make_backend, fake):
    fake.default = Stream(delay_first=2.0)
    backend = make_backend()
    conv = backend.new_conversation()
    conv.add_user("Hi")
    reply = backend.reply(conv, PARAMS)
    await asyncio.sleep(0.2)
    reply.cancel()
    result = await asyncio.wait_for(reply.result(), 2)
    assert result.finish_reason == "cancelled" and result.message.content == "" and result.ttft_ms is None


# -- JSON and tool modes ---------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


async def test_json_mode_asks_for_a_json_schema_response_format(make_backend, fake):
    fake.default = Stream(deltas=['{"city": ', '"Paris"}'])
    backend = make_backend()
    result = await ask(backend, "Where?", grammar=grammar_for(backend, ConstraintSpec("json", SCHEMA)))
    assert json.loads(result.message.content) == {"city": "Paris"}
    fmt = fake.chat_requests[0]["body"]["response_format"]
    assert fmt == {"type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA, "strict": True}}
    assert grammar_for(backend, ConstraintSpec("json")) == {"response_format": {"type": "json_object"}}


async def test_a_server_that_refuses_json_schema_gets_llama_cpps_form(make_backend, fake):
    fake.script = [Status(422, "response_format.type: Input should be 'text' or 'json_object'"), Stream()]
    backend = make_backend()
    result = await ask(backend, grammar=grammar_for(backend, ConstraintSpec("json", SCHEMA)))
    assert result.finish_reason == "stop"
    assert fake.chat_requests[1]["body"]["response_format"] == {"type": "json_object", "schema": SCHEMA}
    # Learnt once for this backend: later replies use that form straight away.
    await ask(backend, grammar=grammar_for(backend, ConstraintSpec("json", SCHEMA)))
    assert (
        len(fake.chat_requests) == 3
        and fake.chat_requests[2]["body"]["response_format"]["type"] == "json_object"
    )


async def test_a_server_error_naming_response_format_also_gets_llama_cpps_form(make_backend, fake):
    # llama-cpp-python's answer to json_schema: a 500 carrying the validation error.
    fake.script = [
        Status(500, "1 validation error: ('body', 'response_format', 'type') Input should be 'text'")
    ]
    backend = make_backend()
    result = await ask(backend, grammar=grammar_for(backend, ConstraintSpec("json", SCHEMA)))
    assert result.finish_reason == "stop" and len(fake.chat_requests) == 2  # switched at once, no retries
    assert fake.chat_requests[1]["body"]["response_format"] == {"type": "json_object", "schema": SCHEMA}


async def test_a_refused_request_that_is_not_about_json_is_reported(make_backend, fake):
    fake.default = Status(422, "bad things")
    backend = make_backend()
    result = await ask(backend, grammar=grammar_for(backend, ConstraintSpec("json", SCHEMA)))
    assert result.finish_reason == "error" and "(422): bad things" in result.error
    assert len(fake.chat_requests) == 2  # the json_object form was tried once


def test_tool_mode_sends_tools_and_tool_choice(make_backend):
    backend = make_backend()
    decls = [{"name": "calculator", "description": "d", "parameters": {"type": "object"}}]
    assert grammar_for(backend, ConstraintSpec("tool", tools=decls, tool_choice={"name": "calculator"})) == {
        "tools": [{"type": "function", "function": decls[0]}],
        "tool_choice": {"type": "function", "function": {"name": "calculator"}},
        "parallel_tool_calls": False,  # max_tool_calls = 1 (the default)
    }
    assert grammar_for(backend, ConstraintSpec("tool", tools=decls))["tool_choice"] == "auto"
    assert (
        grammar_for(backend, ConstraintSpec("tool", tools=decls, max_calls=4))["parallel_tool_calls"] is True
    )
    with pytest.raises(ModeError, match="at least one declared tool"):
        grammar_for(backend, ConstraintSpec("tool", tools=[]))


async def test_tool_calls_from_the_server_run_and_their_results_go_back_with_ids(make_backend, fake):
    fake.script = [
        Stream(
            deltas=[],
            tool_calls=[{"name": "calculator", "arguments": '{"expression": "6*7"}'}],
            finish="tool_calls",
        ),
        Stream(deltas=["It is ", "42."]),
    ]
    backend = make_backend()
    registry = ToolRegistry.from_config([])
    conv = backend.new_conversation(system="Use tools.")
    turn = await run_tool_turn(
        backend,
        conv,
        "What is 6*7?",
        PARAMS,
        registry.select(["calculator"]),
        registry,
        ToolContext(),
        allow_listed(set()),
    )
    assert [c.as_dict()["result"] for c in turn.calls] == ["42"]
    assert turn.text == "It is 42." and len(turn.rounds) == 2
    assert turn.rounds[0].message.tool_calls == [{"name": "calculator", "arguments": {"expression": "6*7"}}]
    second = fake.chat_requests[1]["body"]
    assert second["tools"][0]["function"]["name"] == "calculator"
    assistant, tool = second["messages"][-2:]
    assert assistant["tool_calls"] == [
        {
            "id": "call_fake_0",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
        }
    ]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_fake_0" and tool["content"] == "42"


async def _one_round(backend, fake_stream, fake):
    fake.script = [fake_stream, Stream(deltas=["Done."])]
    registry = ToolRegistry.from_config([])
    return await run_tool_turn(
        backend,
        backend.new_conversation(),
        "What is 6*7?",
        PARAMS,
        registry.select(["calculator"]),
        registry,
        ToolContext(),
        allow_listed(set()),
    )


async def test_a_call_name_repeated_in_every_chunk_is_taken_once(make_backend, fake):
    call = {"name": "calculator", "arguments": '{"expression": "6*7"}'}
    turn = await _one_round(
        make_backend(), Stream(deltas=[], tool_calls=[call], finish="tool_calls", repeat_name=True), fake
    )
    assert [(c.name, c.result) for c in turn.calls] == [("calculator", "42")]


async def test_a_call_cut_by_max_tokens_is_length_and_never_runs(make_backend, fake):
    """Some servers (llama.cpp) say "tool_calls" for a call that ran out of tokens."""
    cut = {"name": "calculator", "arguments": '{"expression": "6*'}
    usage = {"prompt_tokens": 20, "completion_tokens": PARAMS.max_tokens}
    turn = await _one_round(
        make_backend(), Stream(deltas=[], tool_calls=[cut], finish="tool_calls", usage=usage), fake
    )
    assert turn.final.finish_reason == "length" and not turn.calls and len(turn.rounds) == 1


def test_local_tool_calls_get_ids_when_sent_to_a_server(make_backend):
    conv = make_backend().new_conversation()
    conv.add_user("q")
    conv.add_assistant('<tool_call>{"name": "now", "arguments": {}}</tool_call>', [], "stop")
    conv.messages[-1].tool_calls = [{"name": "now", "arguments": {}}, {"name": "now", "arguments": {}}]
    conv.add_tool_result("now", "noon")
    conv.add_tool_result("now", "noon again")
    msgs = request_messages(conv.messages)
    assert msgs[1]["content"] == ""  # the call's text form is not sent: the calls go as tool_calls
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["call_1_0", "call_1_1"]
    assert [m["tool_call_id"] for m in msgs[2:]] == ["call_1_0", "call_1_1"]


# -- models ------------------------------------------------------------------------------------------------


async def test_the_default_model_is_the_servers_only_model(make_backend, fake):
    fake.models = ["org/served-model"]
    backend = make_backend(model="smollm2")
    assert await backend.resolve_model(explicit=False) == "org/served-model"
    await ask(backend)
    assert fake.chat_requests[0]["body"]["model"] == "org/served-model"


async def test_a_named_model_the_server_does_not_serve_is_refused_with_what_it_serves(make_backend, fake):
    fake.models = ["a", "b"]
    with pytest.raises(BackendUnavailableError, match=r"model 'c' is not served by .* \(it serves: a, b\)"):
        await make_backend(model="c").resolve_model(explicit=True)
    with pytest.raises(BackendUnavailableError, match="serves 2 models; choose one with --model"):
        await make_backend(model="smollm2").resolve_model(explicit=False)


async def test_listing_models_on_an_unreachable_server_is_one_line(make_backend):
    with pytest.raises(
        BackendUnavailableError, match=r"^cannot reach http://127\.0\.0\.1:9/v1 \(listing models\)"
    ):
        await make_backend(url="http://127.0.0.1:9").list_models()


async def test_concurrent_replies_are_limited_to_max_concurrent(make_backend, fake):
    fake.default = Stream(delay_each=0.1)
    backend = make_backend(max_concurrent=2)
    convs = [backend.new_conversation() for _ in range(4)]
    for c in convs:
        c.add_user("Hi")
    replies = [backend.reply(c, PARAMS) for c in convs]
    await asyncio.sleep(0.15)
    assert len(fake.chat_requests) == 2
    results = await asyncio.gather(*(r.result() for r in replies))
    assert all(r.finish_reason == "stop" for r in results) and len(fake.chat_requests) == 4


def test_token_counts_are_not_known_on_this_side_of_a_server(make_backend):
    assert make_backend().count_tokens("an attachment's text") is None
