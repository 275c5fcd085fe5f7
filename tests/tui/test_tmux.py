"""Smoke test of the installed ``radixchat`` command in a real terminal (tmux): start, chat, mode, save, quit."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.tui.conftest import wait_until_sync

RADIXCHAT = Path(sys.executable).parent / "radixchat"

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
    pytest.mark.skipif(
        not RADIXCHAT.exists(), reason="the radixchat command is not installed in this environment"
    ),
]


class Tmux:
    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, *args: str) -> str:
        return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout

    def keys(self, *keys: str) -> None:
        self.run("send-keys", "-t", self.name, *keys)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.name)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        try:
            wait_until_sync(lambda: text in self.screen(), timeout=timeout, interval=0.2)
        except AssertionError:
            raise AssertionError(f"{text!r} never appeared; the screen was:\n{self.screen()}") from None
        return self.screen()


@pytest.fixture
def tmux(tmp_path, smol_dir):  # smol_dir: the bundled model is converted before the app starts
    term = Tmux(f"radixchat-test-{uuid.uuid4().hex[:8]}")
    yield term
    subprocess.run(["tmux", "kill-session", "-t", term.name], capture_output=True)


def test_the_installed_command_chats_switches_mode_saves_and_quits(tmux, tmp_path):
    exit_file = tmp_path / "exit-code"
    env = f"XDG_CONFIG_HOME={shlex.quote(str(tmp_path / 'config'))} HF_HUB_OFFLINE=1 TERM=xterm-256color"
    cmd = (
        f"cd {shlex.quote(str(tmp_path))} && env {env} {shlex.quote(str(RADIXCHAT))} --kv-pool-tokens 4096 --no-kv-store "
        f"--max-tokens 24 --temperature 0 --sessions-dir sessions; echo $? > {shlex.quote(str(exit_file))}"
    )
    tmux.run("new-session", "-d", "-s", tmux.name, "-x", "130", "-y", "40", cmd)
    tmux.wait_for("ready · SmolLM2")

    tmux.keys("What is the capital of France?")
    tmux.keys("Enter")
    screen = tmux.wait_for("reused 0 · prefilled")
    assert "What is the capital of France?" in screen and "tok/s" in screen

    tmux.keys("And of Germany?")  # the second turn reuses the first from the cache
    tmux.keys("Enter")
    reused = re.compile(r"reused ([1-9][0-9]*) · prefilled")
    wait_until_sync(lambda: reused.search(tmux.screen()) is not None, timeout=60)
    assert int(reused.search(tmux.screen()).group(1)) > 20

    def mode() -> str:  # the badge that starts the status line
        lines = [ln for ln in tmux.screen().splitlines() if "SmolLM2-135M-Instruct · " in ln]
        return lines[-1].split()[0] if lines else ""

    tmux.keys("C-t")
    wait_until_sync(lambda: mode() == "json", timeout=20)
    tmux.keys("C-t")
    wait_until_sync(lambda: mode() == "tool", timeout=20)
    tmux.keys("C-t")
    wait_until_sync(lambda: mode() == "chat", timeout=20)

    tmux.keys("C-s")
    tmux.wait_for("Save session as")
    tmux.keys("C-u")
    tmux.keys("smoke")
    tmux.keys("Enter")
    saved = tmp_path / "sessions" / "smoke.json"
    wait_until_sync(saved.exists, timeout=20)
    data = json.loads(saved.read_text())
    assert data["model"] == "SmolLM2-135M-Instruct" and [m["role"] for m in data["messages"]][-2:] == [
        "user",
        "assistant",
    ]
    # the autosave was renamed: its file goes just after the new one is written
    wait_until_sync(lambda: not [p for p in os.listdir(saved.parent) if p.startswith("chat-")], timeout=10)

    tmux.keys("C-q")
    wait_until_sync(exit_file.exists, timeout=30)
    assert exit_file.read_text().strip() == "0"
