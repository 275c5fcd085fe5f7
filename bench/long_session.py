"""A long saved session comes back warm in a new process (issue 32, item 6).

Run: ``python -m bench.long_session [--tokens 7000] [--repeats 3]``.

As a user runs it, every step its own ``radixchat --batch`` process with the default settings:
1. a saved session of a ~7k-token chat of facts (written as text, as one typed long ago would be) is
   continued for one turn with ``--save-sessions``: the history is prefilled, the session file saved with
   its token ids, and its KV saved to the disk store;
2. *warm*: a new process continues the saved session for one more turn; its record's TTFT;
3. *cold*: the same continuation with ``--no-kv-store``, so the whole history is prefilled again.
The figure is cold TTFT / warm TTFT (target ≥ 10), and both replies must be the same tokens. The cache
directory is a temporary one that borrows the user's converted model, compiled decode step, kernels and
probes (so nothing is converted or compiled again), and holds its own KV store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import fact_chat

QUESTION = "Which lighthouse is the tallest, and what is its dog called?"
BORROWED = ("models", "compiled", "kernels", "inductor", "grammar", "weights-probe.json")


def _cache_dir(root: Path) -> Path:
    from radixchat.config import default_cache_dir

    cache = root / "cache"
    cache.mkdir()
    for name in BORROWED:
        src = default_cache_dir() / name
        if src.exists():
            (cache / name).symlink_to(src)
    return cache


def write_long_session(root: Path, tokens: int) -> tuple[Path, int]:
    """A saved session (text only, as one typed long ago) of a ~``tokens``-token chat of facts under
    ``root/sessions``: its path and its tokens."""
    from transformers import AutoTokenizer

    from radixchat.chat.session import SessionFile, SessionMessage, save_session
    from radixchat.config import default_cache_dir
    from radixchat.engine.loader import BUNDLED_NAME, resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("smollm2", default_cache_dir())[1])

    def count(messages: list[dict]) -> int:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return len(tok(text, add_special_tokens=False).input_ids)

    messages = fact_chat(count, tokens)
    session = SessionFile(
        name="long",
        model=BUNDLED_NAME,
        system_prompt=messages[0]["content"],
        messages=[SessionMessage(role=m["role"], content=m["content"]) for m in messages],
    )
    path = root / "sessions" / "long.json"
    save_session(session, path)
    return path, count(messages)


def _batch(cache: Path, line: dict, *flags: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "radixchat", "--batch", "-", "--cache-dir", str(cache), *flags],
        input=json.dumps(line) + "\n",
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"radixchat --batch failed ({out.returncode}): {out.stderr[-1500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def once(tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = _cache_dir(root)
        path, history = write_long_session(root, tokens)
        saved = root / "saved"
        line = {"id": "long", "session": str(path), "turns": ["Remember these facts."], "temperature": 0}
        first = _batch(cache, {**line, "max_tokens": 8}, "--save-sessions", str(saved))
        cont = {"id": "next", "session": str(saved / "long.json"), "turns": [QUESTION], "temperature": 0}
        cont["max_tokens"] = 16
        warm = _batch(cache, cont)
        cold = _batch(cache, cont, "--no-kv-store")
    return {
        "history_tokens": history,
        "first_ttft_ms": first["ttft_ms"],
        "warm": {k: warm[k] for k in ("ttft_ms", "usage", "reply")},
        "cold": {k: cold[k] for k in ("ttft_ms", "usage", "reply")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=7000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    runs = [once(args.tokens) for _ in range(args.repeats)]
    from radixchat.machine import cpu_isa, cpu_name

    warm = statistics.median(r["warm"]["ttft_ms"] for r in runs)
    cold = statistics.median(r["cold"]["ttft_ms"] for r in runs)
    same = all(r["warm"]["reply"] == r["cold"]["reply"] for r in runs)
    print(f"# a long session reopened in a new process — {cpu_name()} [{cpu_isa()}], {os.cpu_count()} cores")
    print(f"command: python -m bench.long_session --tokens {args.tokens} --repeats {args.repeats}\n")
    print(
        f"history: {runs[0]['history_tokens']} tokens; prompt {runs[0]['warm']['usage']['prompt_tokens']}\n"
    )
    print("| | first-turn TTFT (ms) | cached tokens |")
    print("|---|---|---|")
    print(
        f"| cold: the whole history prefilled (--no-kv-store) | {cold:.0f} | {runs[0]['cold']['usage']['cached_tokens']} |"
    )
    print(
        f"| warm: its KV loaded from the disk store | {warm:.0f} | {runs[0]['warm']['usage']['cached_tokens']} |"
    )
    print(f"\ncold / warm: **{cold / warm:.1f}×** (target ≥ 10); the same reply: {same}")
    Path("bench/results").mkdir(parents=True, exist_ok=True)
    Path("bench/results/long_session.json").write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
