"""MCP servers as tools (chat/mcp_client.py), against the fixture server run for real: over stdio and
over streamable HTTP."""

from __future__ import annotations

import os
import signal
import sys
import time

import jsonschema
import pytest

from radixchat.chat.mcp_client import McpTools
from radixchat.chat.tools import ToolContext, ToolRegistry, allow_listed, deny_all, user_tool
from radixchat.config import McpServerConfig, Settings, UserToolConfig
from tests.chat.mcp_servers import http_server, stdio_server

ALLOW = allow_listed({"fx_add", "fx_echo", "fx_slow", "fx_fail", "fx_pid", "web_add", "fx2_echo"})


async def started(*servers: McpServerConfig, registry: ToolRegistry | None = None, tmp_path=None):
    registry = registry or ToolRegistry()
    notices: list[str] = []
    mcp = McpTools(list(servers), registry, tmp_path)
    await mcp.start(notices.append)
    return mcp, registry, notices


async def call(registry, name, args, consent=ALLOW):
    return await registry.call(name, args, ToolContext(), consent)


async def test_a_stdio_servers_tools_join_the_registry_named_after_it(tmp_path):
    mcp, reg, notices = await started(stdio_server("fx"), tmp_path=tmp_path)
    try:
        assert notices == []
        mine = {n: t for n, t in reg.tools.items() if t.source == "mcp:fx"}
        assert sorted(mine) == ["fx_add", "fx_echo", "fx_fail", "fx_pid", "fx_slow"]
        add = mine["fx_add"]
        assert not add.builtin and add.description == "Add two integers."
        assert add.parameters["properties"]["a"]["type"] == "integer" and add.parameters["required"] == [
            "a",
            "b",
        ]
        assert "calculator" in reg.tools  # the built-ins stay
        assert (await call(reg, "fx_add", {"a": 2, "b": 40})).result == "42"
    finally:
        await mcp.aclose()


async def test_an_http_servers_tools_are_listed_and_called():
    with http_server() as url:
        mcp, reg, notices = await started(McpServerConfig(name="web", url=url, timeout_s=10))
        try:
            assert notices == [] and "web_echo" in reg.tools and reg.tools["web_add"].source == "mcp:web"
            record = await call(reg, "web_add", {"a": -3, "b": 5})
            assert record.error is None and record.result == "2"
        finally:
            await mcp.aclose()


async def test_an_mcp_tool_runs_only_with_consent():
    mcp, reg, _ = await started(stdio_server("fx"))
    try:
        refused = await call(reg, "fx_echo", {"text": "hi"}, deny_all)
        assert refused.result is None and "did not allow" in refused.error
        assert (await call(reg, "fx_echo", {"text": "hi"}, allow_listed({"fx_add"}))).error
        assert (await call(reg, "fx_echo", {"text": "hi"})).result == "hi"
    finally:
        await mcp.aclose()


async def test_arguments_are_checked_against_the_input_schema_before_the_server_sees_them():
    mcp, reg, _ = await started(stdio_server("fx"))
    try:
        record = await call(reg, "fx_add", {"a": "two", "b": 1})
        assert record.result is None and "invalid argument 'a'" in record.error
    finally:
        await mcp.aclose()


async def test_an_error_result_and_a_call_past_timeout_s_come_back_as_errors():
    # timeout_s also bounds the server's start (a Python interpreter importing the SDK: seconds on a busy
    # machine), so it is not shorter than that.
    mcp, reg, _ = await started(stdio_server("fx", timeout_s=5))
    try:
        failed = await call(reg, "fx_fail", {"message": "no such city"})
        assert failed.result is None and "no such city" in failed.error
        started_at = time.monotonic()
        slow = await call(reg, "fx_slow", {"seconds": 60})
        assert slow.error == "timed out after 5 s" and time.monotonic() - started_at < 15
        assert (await call(reg, "fx_add", {"a": 1, "b": 1})).result == "2"  # the server still serves
    finally:
        await mcp.aclose()


async def test_servers_that_cannot_start_are_notices_and_the_others_serve(tmp_path):
    exits = McpServerConfig(
        name="exits", command=[sys.executable, "-c", "import sys; sys.exit('no token configured')"]
    )
    missing = McpServerConfig(name="missing", command="no-such-mcp-server --stdio")
    nothing = McpServerConfig(name="nothing", url="http://127.0.0.1:9/mcp", timeout_s=5)
    mcp, reg, notices = await started(exits, missing, nothing, stdio_server("fx"), tmp_path=tmp_path)
    try:
        text = "\n".join(notices)
        assert len(notices) == 3, text
        assert "'exits'" in text and "exited before it answered: no token configured" in text
        assert "cannot start 'no-such-mcp-server': command not found" in text
        assert "cannot use http://127.0.0.1:9/mcp" in text
        assert set(mcp.failed) == {"exits", "missing", "nothing"}
        assert not [n for n in reg.tools if n.startswith(("exits_", "missing_", "nothing_"))]
        assert (await call(reg, "fx_add", {"a": 1, "b": 2})).result == "3"
    finally:
        await mcp.aclose()


async def test_a_server_that_hangs_past_timeout_s_is_a_notice_and_is_stopped(tmp_path):
    pidfile = tmp_path / "pid"
    hang = stdio_server("hang", "hang", str(pidfile), timeout_s=1)
    started_at = time.monotonic()
    mcp, reg, notices = await started(hang)
    await mcp.aclose()
    assert notices == [
        "MCP server 'hang' (" + " ".join(hang.command) + "): no answer within 1 s; its tools are left out"
    ]
    assert time.monotonic() - started_at < 10
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


async def test_a_server_that_dies_mid_session_is_a_notice_and_its_tools_leave():
    mcp, reg, notices = await started(stdio_server("fx"), stdio_server("fx2"))
    try:
        pid = int((await call(reg, "fx_pid", {})).result)
        os.kill(pid, signal.SIGKILL)
        record = await call(reg, "fx_add", {"a": 1, "b": 1})
        assert record.result is None and "stopped" in record.error
        assert notices == ["MCP server 'fx' stopped (connection closed); its tools are no longer offered"]
        assert not [n for n in reg.tools if n.startswith("fx_")]
        assert (await call(reg, "fx2_echo", {"text": "still here"})).result == "still here"
        assert (await call(reg, "calculator", {"expression": "6*7"})).result == "42"
    finally:
        await mcp.aclose()


async def test_a_name_taken_by_a_config_tool_is_left_out_with_a_notice():
    taken = UserToolConfig(name="fx_echo", command=["cat"])
    registry = ToolRegistry()
    registry.add([user_tool(taken)])
    mcp, reg, notices = await started(stdio_server("fx"), registry=registry)
    try:
        assert notices == ["MCP server 'fx': tool 'fx_echo' clashes with a config tool (left out)"]
        assert reg.tools["fx_echo"].source == "config" and "fx_add" in reg.tools
    finally:
        await mcp.aclose()


def test_a_server_needs_exactly_one_of_command_and_url(tmp_path):
    from radixchat.errors import ConfigError

    cases = {
        'name = "x"\n': "give exactly one of command",
        'name = "x"\ncommand = "a"\nurl = "http://h/mcp"\n': "give exactly one of command",
        'name = "x"\nurl = "ftp://h"\n': "must be an http(s):// URL",
        'name = "x"\nurl = "http://h/mcp"\nenv = {A = "1"}\n': "env is for servers started with command",
        'name = "a_b"\ncommand = "a"\n': "name",
    }
    for body, expected in cases.items():
        path = tmp_path / "config.toml"
        path.write_text("[[mcp_servers]]\n" + body)
        with pytest.raises(ConfigError, match="mcp_servers") as info:
            Settings.load(config_file=path)
        assert expected in str(info.value) and str(path) in str(info.value), str(info.value)
    path.write_text('[[mcp_servers]]\nname = "x"\ncommand = "srv --stdio"\ntimeout_s = 5\n')
    server = Settings.load(config_file=path).mcp_servers[0]
    assert server.command == ["srv", "--stdio"] and server.timeout_s == 5


@pytest.mark.real_model
async def test_a_real_model_call_follows_the_input_schema_and_runs_on_the_server(smol):
    """The tool's inputSchema is the argument grammar: a call forced on fx_add gives integers a and b,
    and the server's sum is the result the model reads."""
    from radixchat.chat.local import LocalBackend
    from radixchat.chat.tool_turn import run_tool_turn
    from radixchat.engine import Engine, EngineConfig, SamplingParams

    mcp, reg, _ = await started(stdio_server("fx"))
    try:
        async with Engine(smol[0], EngineConfig(kv_pool_tokens=4096)) as engine:
            backend = LocalBackend(engine)
            conv = backend.new_conversation(system="You can use tools.")
            turn = await run_tool_turn(
                backend,
                conv,
                "What is 17 plus 25?",
                SamplingParams(max_tokens=60, temperature=0.0),
                [reg.tools["fx_add"]],
                reg,
                ToolContext(),
                ALLOW,
                tool_choice={"name": "fx_add"},
                max_rounds=1,
            )
        (record,) = turn.calls
        jsonschema.validate(record.arguments, reg.tools["fx_add"].parameters)
        assert record.error is None
        assert record.result == str(record.arguments["a"] + record.arguments["b"])
    finally:
        await mcp.aclose()
