"""`radixchat` start to a usable prompt, and to a ready engine, with a warm model cache.

Starts the installed command in a tmux pane (a real terminal) and polls the screen every 20 ms:
- *prompt usable*: the message box is drawn (typing works, and Enter queues the message until the model
  is ready);
- *engine ready*: the status line says "ready".
Run: ``python -m bench.startup [--repeats N]`` (needs tmux; the model must have been converted once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT_MARK = "Message (Enter sends"
READY_MARK = "ready ·"


def once(radixchat: str) -> tuple[float, float]:
    session = f"startup{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        env = f"XDG_CONFIG_HOME={tmp}/config RADIXCHAT_SESSIONS_DIR={tmp}/sessions"
        started = time.perf_counter()
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", session, "-x", "140", "-y", "40", f"env {env} {radixchat}"],
            check=True,
        )
        prompt_at = ready_at = None
        try:
            while time.perf_counter() - started < 60 and ready_at is None:
                screen = subprocess.run(
                    ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
                ).stdout
                now = time.perf_counter() - started
                if prompt_at is None and PROMPT_MARK in screen:
                    prompt_at = now
                if READY_MARK in screen:
                    ready_at = now
                time.sleep(0.02)
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    if prompt_at is None or ready_at is None:
        raise RuntimeError("the app did not come up within 60 s")
    return prompt_at, ready_at


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    radixchat = shutil.which("radixchat") or str(Path(sys.executable).with_name("radixchat"))
    if shutil.which("tmux") is None:
        print("tmux is not installed")
        return 1
    once(radixchat)  # warm the OS file cache and the converted model
    runs = [once(radixchat) for _ in range(args.repeats)]
    prompt = statistics.median(r[0] for r in runs)
    ready = statistics.median(r[1] for r in runs)
    print(f"## radixchat start-up (median of {args.repeats}, warm model cache)\n")
    print("| milestone | seconds |\n|---|---|")
    print(f"| prompt usable (typing; Enter queues) | {prompt:.2f} |")
    print(f"| engine ready (model loaded, pool built) | {ready:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
