"""`radixchat` start to a usable prompt, and to a ready backend, in a real terminal.

Starts a command in a tmux pane and polls the screen every 20 ms:
- *prompt usable*: the message box is drawn (typing works, and Enter queues the message until the
  backend is ready);
- *backend ready*: the status line says "ready" (the model loaded and the pool built, or for
  ``--backend URL`` the server answered with its models).

Three commands, measured in the same run:
- ``local``: ``radixchat`` on the bundled model (warm model cache; the model must have been converted once);
- ``remote``: ``radixchat --backend URL`` on a local fake OpenAI-compatible server (``tests/remote``), so
  the figure is radixchat's own start-up, not a network's or a server's;
- ``baseline``: an empty Textual app drawing the same prompt text: the floor of any Textual app here
  (Python start-up, importing Textual, the first frame). Ratios are against it.

radixchat's modules are byte-compiled first, as an installed package is (``scripts/setup.sh`` does the
same): where ``PYTHONDONTWRITEBYTECODE`` is set, an editable install would otherwise compile every
module at every start.

Run: ``python -m bench.startup [--repeats N] [--only local|remote]`` (needs tmux).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from radixchat.machine import cpu_isa, cpu_name

PROMPT_MARK = "Message (Enter sends"
READY_MARK = "ready ·"
BASELINE_APP = f"""
from textual.app import App
from textual.widgets import Static
class Floor(App):
    def compose(self):
        yield Static("{PROMPT_MARK} · {READY_MARK}")
Floor().run()
"""


TMUX = ["tmux", "-L", f"radixchat-startup-{os.getpid()}"]  # a private server: others' tmux use is theirs


def once(command: str, timeout_s: float = 60.0) -> tuple[float, float]:
    """Seconds from starting ``command`` in a tmux pane to the prompt showing, and to "ready"."""
    session = "startup"
    with tempfile.TemporaryDirectory() as tmp:
        env = f"XDG_CONFIG_HOME={tmp}/config RADIXCHAT_SESSIONS_DIR={tmp}/sessions"
        started = time.perf_counter()
        subprocess.run(
            [*TMUX, "new-session", "-d", "-s", session, "-x", "140", "-y", "40", f"env {env} {command}"],
            check=True,
        )
        prompt_at = ready_at = None
        try:
            while time.perf_counter() - started < timeout_s and ready_at is None:
                screen = subprocess.run(
                    [*TMUX, "capture-pane", "-p", "-t", session], capture_output=True, text=True
                ).stdout
                now = time.perf_counter() - started
                if prompt_at is None and PROMPT_MARK in screen:
                    prompt_at = now
                if READY_MARK in screen:
                    ready_at = now
                time.sleep(0.02)
        finally:
            subprocess.run([*TMUX, "kill-session", "-t", session], capture_output=True)
    if prompt_at is None or ready_at is None:
        raise RuntimeError(f"{command} did not come up within {timeout_s:.0f} s")
    return prompt_at, ready_at


def medians(command: str, repeats: int) -> tuple[float, float]:
    once(command)  # warm the OS file cache (and, locally, the converted model)
    runs = [once(command) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--only", choices=("local", "remote"), help="measure one of the two (and the baseline)"
    )
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("tmux is not installed")
        return 1
    radixchat = shutil.which("radixchat") or str(Path(sys.executable).with_name("radixchat"))
    # A session that lives for the whole run: tmux exits with its last session, and a new session started
    # while it exits fails ("server exited unexpectedly").
    subprocess.run([*TMUX, "new-session", "-d", "-s", "keep", "sleep 86400"], check=True)
    try:
        rows, base_prompt = measure(radixchat, args.repeats, args.only)
    finally:
        subprocess.run([*TMUX, "kill-server"], capture_output=True)
    print(
        f"## radixchat start-up (median of {args.repeats}; {cpu_name()} [{cpu_isa()}], {os.cpu_count()} CPUs)\n"
    )
    print(f"baseline: an empty Textual app draws its first frame in {base_prompt:.2f} s\n")
    print("| command | prompt usable (s) | vs baseline | backend ready (s) |\n|---|---|---|---|")
    for name, prompt, ready in rows:
        print(f"| {name} | {prompt:.2f} | {prompt / base_prompt:.2f}× | {ready:.2f} |")
    return 0


def measure(radixchat: str, repeats: int, only: str | None) -> tuple[list[tuple[str, float, float]], float]:
    """(command, prompt usable, backend ready) rows, and the baseline's first frame."""
    rows: list[tuple[str, float, float]] = []
    package = Path(__file__).resolve().parents[1] / "radixchat"
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        floor = Path(tmp) / "floor.py"
        floor.write_text(BASELINE_APP)
        base_prompt, _ = medians(f"{shlex.quote(sys.executable)} {floor}", repeats)
    if only != "remote":
        rows.append(("local (bundled model)", *medians(radixchat, repeats)))
    if only != "local":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.remote.fake_server import FakeServer

        server = FakeServer().start()
        try:
            command = f"{radixchat} --backend {server.url} --model fake-model"
            rows.append(("remote (--backend URL)", *medians(command, repeats)))
        finally:
            server.stop()
    return rows, base_prompt


if __name__ == "__main__":
    raise SystemExit(main())
