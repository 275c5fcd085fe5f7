"""The command's exit skips the interpreter's teardown, and loses nothing by it: atexit handlers run, buffered
output reaches a pipe, the exit code is kept, and a thread still working is waited for."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_exit_now_runs_the_atexit_handlers_flushes_a_pipe_and_keeps_the_code():
    done = _run(
        "import atexit, sys\n"
        "from radixchat.cli import exit_now\n"
        "atexit.register(lambda: print('handler ran'))\n"
        "sys.stdout.write('x' * 200_000)\n"  # more than a pipe buffer and Python's own
        "sys.stderr.write('on stderr')\n"
        "exit_now(5)\n"
        "print('not reached')\n"
    )
    assert done.returncode == 5
    assert done.stdout == "x" * 200_000 + "handler ran\n"
    assert done.stderr == "on stderr"


def test_exit_now_waits_for_a_thread_that_is_still_working():
    done = _run(
        "import threading, time\n"
        "from radixchat.cli import exit_now\n"
        "def work():\n"
        "    time.sleep(0.5)\n"
        "    print('thread finished', flush=True)\n"
        "threading.Thread(target=work).start()\n"
        "exit_now(3)\n"
    )
    assert done.returncode == 3
    assert done.stdout == "thread finished\n"


def test_the_command_ends_as_main_returns():
    args = ["--chat-template", "nope", "-p", "hi"]  # a usage error that main returns, not raises
    fast = subprocess.run(
        [sys.executable, "-m", "radixchat", *args], capture_output=True, text=True, timeout=60
    )
    usual = _run(f"import sys; from radixchat.cli import main; sys.exit(main({args!r}))")
    assert fast.returncode == usual.returncode == 2
    assert (fast.stdout, fast.stderr) == (usual.stdout, usual.stderr)
    assert fast.stderr.startswith("radixchat: ") and fast.stderr.count("\n") == 1
