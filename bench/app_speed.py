"""The chat app keeps up with batch mode: decode tokens/s of the same long reply in both (issue 11, item 5).

Run: ``python -m bench.app_speed [--repeats 3] [--max-tokens 128]``.

Each run is its own process, alternating, with the user's default settings (weights ``auto``; temperature 0):
- *batch*: ``radixchat --batch -`` with one conversation; the record's ``decode_tokens_per_s``;
- *app*: the Textual app with its live side panels (headless ``App.run_test``, 140×40), the prompt typed
  and sent as a user would; the reply's decode tokens/s as its footer shows it. Run as the CLI runs it
  (``settled_heap``: the loaded heap is frozen out of the garbage collector).
The ratio app / batch is the figure (target ≥ 0.95); medians over ``repeats``. With ``--history N`` both
continue a saved session of a ~N-token chat of facts (the app opens it as ``--session`` does), so the reply
decodes over a long context.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.long_session import write_long_session

PROMPT = "Write a long story about a lighthouse keeper and a storm. Use many details."


def batch_once(max_tokens: int, session: Path | None = None) -> float:
    line = {"id": "story", "turns": [PROMPT], "max_tokens": max_tokens, "temperature": 0}
    if session is not None:
        line["session"] = str(session)
    line = json.dumps(line)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [sys.executable, "-m", "radixchat", "--batch", "-", "--sessions-dir", tmp, "--no-kv-store"],
            input=line + "\n",
            capture_output=True,
            text=True,
            check=True,
        )
    record = json.loads(out.stdout.strip().splitlines()[-1])
    return float(record["decode_tokens_per_s"]), int(record["usage"]["completion_tokens"])


async def _app(max_tokens: int, session: Path | None = None) -> tuple[float, int]:
    from radixchat.chat.session import load_session
    from radixchat.config import Settings
    from radixchat.tui.app import RadixChatApp

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings.load(
            {"sessions_dir": tmp, "temperature": 0, "max_tokens": max_tokens, "kv_store": False}
        )
        app = RadixChatApp(settings, session=load_session(session) if session is not None else None)
        async with app.run_test(size=(140, 40)) as pilot:
            deadline = time.monotonic() + 120
            while not (app.backend is not None and app.chat.state.conv is not None):
                if time.monotonic() > deadline:
                    raise RuntimeError("the app did not become ready")
                await asyncio.sleep(0.1)
            app.chat.prompt.focus()
            app.chat.prompt.load_text(PROMPT)
            done = app.chat.turns_finished
            await pilot.press("enter")
            while app.chat.turns_finished <= done:
                await asyncio.sleep(0.2)
            usage = app.chat.state.conv.messages[-1].meta
            await pilot.press("ctrl+q")
    return float(usage["decode_tokens_per_s"]), int(usage["usage"]["completion_tokens"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--history", type=int, default=0, help="continue a saved ~N-token chat (0: none)")
    parser.add_argument("--child-app", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--session", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_app:
        from radixchat.chat.loading import settled_heap

        with settled_heap():  # as the CLI runs the app
            print(json.dumps(asyncio.run(_app(args.max_tokens, args.session))))
        return 0
    session = write_long_session(Path(tempfile.mkdtemp()), args.history)[0] if args.history else None
    child = ["--session", str(session)] if session is not None else []
    batch, app = [], []
    for _ in range(args.repeats):
        batch.append(batch_once(args.max_tokens, session))
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.app_speed",
                "--child-app",
                "--max-tokens",
                str(args.max_tokens),
                *child,
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "XDG_CONFIG_HOME": tempfile.mkdtemp()},
        )
        app.append(tuple(json.loads(out.stdout.strip().splitlines()[-1])))
    from radixchat.machine import cpu_name

    b, a = statistics.median(t for t, _ in batch), statistics.median(t for t, _ in app)
    print(f"# chat app vs batch mode — {cpu_name()}, {os.cpu_count()} cores; median of {args.repeats}")
    history = f" --history {args.history}" if args.history else ""
    print(
        f"command: python -m bench.app_speed --repeats {args.repeats} --max-tokens {args.max_tokens}{history}\n"
    )
    print("| | batch mode | chat app | app / batch |")
    print("|---|---|---|---|")
    print(f"| decode tok/s ({batch[0][1]} tokens) | {b:.1f} | {a:.1f} | **{a / b:.2f}×** |")
    print(f"\nruns: batch {[round(t, 1) for t, _ in batch]}, app {[round(t, 1) for t, _ in app]}")
    Path("bench/results").mkdir(parents=True, exist_ok=True)
    name = f"app_speed_{args.history}" if args.history else "app_speed"
    Path(f"bench/results/{name}.json").write_text(json.dumps({"batch": batch, "app": app}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
