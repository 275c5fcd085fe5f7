"""MCP servers in the chat app: their tools arrive after the first frame, ask before each call and show
their result; a server that fails is a notice and the chat goes on; the servers stop with the app."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import radixchat.tui.screens.consent as consent_screen
from radixchat.config import McpServerConfig
from radixchat.tui.screens.consent import ConsentScreen
from radixchat.tui.widgets.tool_call import ToolCallBlock
from tests.chat.mcp_servers import FIXTURE, stdio_server
from tests.tui.conftest import TERMINAL, ToolFakeBackend, call_then_answer, ready, say, turn_done, wait_until

ROOT = Path(__file__).resolve().parents[2]
GONE = McpServerConfig(name="gone", command="no-such-mcp-server --stdio")


@pytest.fixture(autouse=True)
def quick_consent(monkeypatch):
    monkeypatch.setattr(consent_screen, "ARM_DELAY", 0.05)


def notices(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def tools_arrived(app, pilot, name: str) -> None:
    await wait_until(lambda: name in app.chat.core.registry.tools, timeout=30, pilot=pilot)


async def test_an_mcp_tool_asks_naming_its_server_and_its_result_goes_to_the_model(make_app, settings):
    settings = settings.model_copy(update={"mcp_servers": [stdio_server("fx")]})
    fake = ToolFakeBackend(call_then_answer("fx_add", {"a": 2, "b": 3}))
    app = make_app(backend=fake, settings=settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await tools_arrived(app, pilot, "fx_add")
        app.chat.state.tool_names = ["calculator", "fx_add"]
        await app.chat.action_set_mode("tool")
        assert app.chat.mode_problem is None
        done = app.chat.turns_finished
        await say(app, pilot, "What is 2+3?", wait=False)
        await wait_until(lambda: isinstance(app.screen, ConsentScreen) and app.screen.armed, pilot=pilot)
        said = app.screen.query_one("Markdown").source
        assert "Add two integers." in said and "MCP server **fx**" in said and str(FIXTURE) in said
        await pilot.press("y")
        await turn_done(app, pilot, done)
        assert app.query_one(ToolCallBlock).result == "5"
        assert app.chat.transcript.last_assistant().message.content == "The tool said: 5"


async def test_a_server_that_fails_is_a_notice_and_the_chat_goes_on(make_app, settings):
    settings = settings.model_copy(update={"mcp_servers": [GONE, stdio_server("fx")]})
    fake = ToolFakeBackend(call_then_answer("calculator", {"expression": "6*7"}))
    app = make_app(backend=fake, settings=settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await tools_arrived(app, pilot, "fx_add")
        assert notices(app) == [
            "MCP server 'gone' (no-such-mcp-server --stdio): cannot start 'no-such-mcp-server': "
            "command not found; its tools are left out"
        ]
        await app.chat.action_set_mode("tool")
        await say(app, pilot, "What is 6*7?")
        assert app.chat.transcript.last_assistant().message.content == "The tool said: 42"


async def test_the_servers_stop_when_the_app_quits(make_app, settings):
    settings = settings.model_copy(update={"mcp_servers": [stdio_server("fx")]})
    fake = ToolFakeBackend(call_then_answer("fx_pid", {}))
    app = make_app(backend=fake, settings=settings)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await tools_arrived(app, pilot, "fx_pid")
        app.chat.state.tool_names = ["fx_pid"]
        await app.chat.action_set_mode("tool")
        await say(app, pilot, "Which process?", wait=False)
        await wait_until(lambda: isinstance(app.screen, ConsentScreen) and app.screen.armed, pilot=pilot)
        await pilot.press("y")
        await turn_done(app, pilot, 0)
        pid = int(app.query_one(ToolCallBlock).result)
        os.kill(pid, 0)  # running
        await pilot.press("ctrl+q")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


FIRST_FRAME = textwrap.dedent(
    """
    import asyncio, sys
    from radixchat.config import McpServerConfig, Settings
    from radixchat.tui.app import RadixChatApp
    from tests.tui.conftest import FakeBackend

    seen = []
    shown = RadixChatApp.on_chat_shown

    def on_chat_shown(self, event):
        seen.append("mcp" in sys.modules)
        shown(self, event)

    RadixChatApp.on_chat_shown = on_chat_shown
    server = McpServerConfig(name="fx", command=[sys.executable, {fixture!r}])
    settings = Settings.load({{"sessions_dir": {sessions!r}, "model": "fake"}}).model_copy(
        update={{"mcp_servers": [server]}}
    )

    async def main():
        app = RadixChatApp(settings, backend_factory=lambda s, p: FakeBackend(), panel_interval=None)
        async with app.run_test() as pilot:
            for _ in range(600):
                if "fx_add" in app.chat.core.registry.tools:
                    break
                await pilot.pause(0.05)
            print(seen, "mcp" in sys.modules, "fx_add" in app.chat.core.registry.tools)

    asyncio.run(main())
    """
)


def test_the_first_frame_does_not_wait_for_the_servers_or_import_mcp(tmp_path):
    code = FIRST_FRAME.format(fixture=str(FIXTURE), sessions=str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[False] True True"


def test_snapshot_an_mcp_tool_call_and_a_server_that_failed(snap_compare, settings):
    """The tool turn's call block names the MCP tool (SERVER_TOOL) with the server's result; the notice
    says which server failed and why."""
    from radixchat.tui.app import RadixChatApp
    from tests.tui.test_snapshots import WIDE, settle

    settings = settings.model_copy(update={"mcp_servers": [GONE, stdio_server("fx")]})
    fake = ToolFakeBackend(call_then_answer("fx_add", {"a": 1234, "b": 4321}))
    app = RadixChatApp(settings, backend_factory=lambda s, p: fake, panel_interval=None, session="mcp")

    async def run_before(pilot) -> None:
        await ready(app, pilot)
        await tools_arrived(app, pilot, "fx_add")
        app.chat.state.tool_names = ["fx_add"]
        await app.chat.action_set_mode("tool")
        await say(app, pilot, "What is 1234 + 4321?", wait=False)
        await wait_until(lambda: isinstance(app.screen, ConsentScreen) and app.screen.armed, pilot=pilot)
        await pilot.press("y")
        await turn_done(app, pilot, 0)
        block = app.query_one(ToolCallBlock)
        block.set_outcome(block.result, block.error, 0.4)
        block.collapsed = False
        await app.chat.refresh_panels_now()
        await settle(pilot)

    assert snap_compare(app, terminal_size=WIDE, run_before=run_before)
