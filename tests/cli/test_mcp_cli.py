"""MCP servers from the command line: ``radixchat --list-tools`` and batch lines that call an MCP tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.chat.mcp_servers import http_server, stdio_toml

USER_TOOL = '[[tools]]\nname = "wc"\ndescription = "Count words."\ncommand = "wc -w"\n'


def radixchat(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RADIXCHAT_TEMPERATURE": "0"}
    return subprocess.run(
        [sys.executable, "-m", "radixchat", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def table(stdout: str) -> dict[str, tuple[str, str]]:
    rows = [line.split(None, 2) for line in stdout.splitlines()]
    assert rows[0] == ["NAME", "SOURCE", "DESCRIPTION"]
    return {r[0]: (r[1], r[2] if len(r) > 2 else "") for r in rows[1:]}


def test_list_tools_shows_every_tool_and_where_it_comes_from_without_loading_the_model(tmp_path):
    config = tmp_path / "config.toml"
    with http_server() as url:
        config.write_text(USER_TOOL + stdio_toml("fx") + f'[[mcp_servers]]\nname = "web"\nurl = "{url}"\n')
        # A model that cannot load: listing the tools must not try.
        proc = radixchat("--config", str(config), "--list-tools", "--model", str(tmp_path / "no-model"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    rows = table(proc.stdout)
    assert rows["calculator"][0] == "built-in" and rows["wc"] == ("config", "Count words.")
    assert rows["fx_add"] == ("mcp:fx", "Add two integers.")
    assert rows["web_echo"] == ("mcp:web", "Say the text back.")


def test_list_tools_names_a_server_that_fails_and_exits_1(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(stdio_toml("fx") + '[[mcp_servers]]\nname = "gone"\ncommand = "no-such-mcp-server"\n')
    proc = radixchat("--config", str(config), "--list-tools")
    assert proc.returncode == 1
    assert "fx_add" in table(proc.stdout) and not [n for n in table(proc.stdout) if n.startswith("gone")]
    assert proc.stderr.strip() == (
        "radixchat: MCP server 'gone' (no-such-mcp-server): cannot start 'no-such-mcp-server': "
        "command not found; its tools are left out"
    )


def test_a_bad_server_table_is_a_usage_error_naming_it(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[[mcp_servers]]\nname = "x"\n')
    proc = radixchat("--config", str(config), "--list-tools")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"radixchat: invalid [[mcp_servers]] #1 in {config}: give exactly one of command (a stdio server) "
        "or url (a streamable-HTTP server)"
    )
    proc = radixchat("--list-tools", "-p", "hi")
    assert proc.returncode == 2 and "--list-tools" in proc.stderr


@pytest.mark.real_model
def test_a_batch_line_calls_an_mcp_tool_only_when_allowed(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(stdio_toml("fx"))
    line = {
        "id": "sum",
        "mode": "tool",
        "tools": ["fx_add"],
        "tool_choice": {"name": "fx_add"},
        "turns": ["What is 17 plus 25?"],
        "max_tokens": 60,
    }
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(line) + "\n")
    proc = radixchat("--config", str(config), "--batch", str(path), timeout=300)
    (call,) = json.loads(proc.stdout)["tool_calls"]
    assert call["name"] == "fx_add" and "did not allow" in call["error"] and call["result"] is None

    proc = radixchat("--config", str(config), "--batch", str(path), "--allow-tools", "fx_add", timeout=300)
    assert proc.returncode == 0, proc.stderr
    (call,) = json.loads(proc.stdout)["tool_calls"]
    assert call["error"] is None and call["result"] == str(call["arguments"]["a"] + call["arguments"]["b"])

    proc = radixchat("--config", str(config), "--batch", str(path), "--allow-tools", "other_add")
    assert proc.returncode == 2 and "'other_add' is not a user tool" in proc.stderr
