"""Real MCP servers for the tests: the fixture server over stdio (a config entry radixchat starts) or over
streamable HTTP (a subprocess on a free port, stopped when the test ends)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from radixchat.config import McpServerConfig

FIXTURE = Path(__file__).with_name("mcp_fixture_server.py")


def stdio_server(name: str = "fx", *args: str, timeout_s: float = 10) -> McpServerConfig:
    return McpServerConfig(name=name, command=[sys.executable, str(FIXTURE), *args], timeout_s=timeout_s)


def stdio_toml(name: str = "fx") -> str:
    """The same server as a ``[[mcp_servers]]`` table of a config file."""
    return f'[[mcp_servers]]\nname = "{name}"\ncommand = ["{sys.executable}", "{FIXTURE}"]\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    """The fixture server over streamable HTTP; yields its URL once it accepts connections."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FIXTURE), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the HTTP fixture server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()
