"""Memory and start-up next to llama.cpp on a model a person brings (issue 35): one-reply runs, each a new process.

    python -m bench.model_memory [--model 1b|FILE.gguf] [--runs 3] [--tokens 64] [--threads 2] [--json PATH]

``1b`` (the default) is ``bench/model_1b.py``'s Llama-3.2-1B-shaped Q4_0 GGUF (written on first use). Each run is
a fresh process answering one chat prompt with ``--tokens`` greedy tokens, as a user's one-shot:

- **llama.cpp** (llama-cpp-python, ``n_threads``): load the GGUF, generate, exit;
- **radixchat**: ``radixchat -p PROMPT --model FILE`` with the settings a user has (``weights = auto``,
  ``compile = auto``); the first run starts from an empty cache directory, so it includes the one-time
  conversion, the weights probe and the start of the compiled-step builder; later runs reuse the cache.

Per run: wall time (process start to exit) and the peak RSS of the process (``wait4``'s ``ru_maxrss``). While a
radixchat run lasts, and after it until its builder exits (``--builder-wait`` seconds at most), the RSS of the
app and of any compiled-step builder is sampled every 0.1 s: "together" is the peak of their sum. Ratios are
against llama.cpp's median in the same invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

PROMPT = "Write a short story about a lighthouse keeper and a storm."
LLAMA_CHILD = r"""
import sys
from llama_cpp import Llama
path, threads, tokens, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = Llama(path, n_threads=threads, n_ctx=4096, verbose=False)
out = llm.create_chat_completion([{"role": "user", "content": prompt}], max_tokens=tokens, temperature=0.0)
print(len(out["choices"][0]["message"]["content"]))
"""


def _rss_tree(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):  # a process that has just exited
            total += psutil.Process(pid).memory_info().rss
    return total


def _builders() -> list[int]:
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if "radixchat.engine.decode_graph" in cmd:
            out.append(proc.info["pid"])
    return out


def run(cmd: list[str], env: dict[str, str], builder_wait: float = 0.0) -> dict:
    """Run ``cmd``; its wall time, peak RSS, and the peak RSS of it plus any builder, sampled."""
    peak = {"together": 0, "builder": 0}
    stop = threading.Event()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def sample() -> None:
        while not stop.is_set():
            builders = _builders()
            b = _rss_tree(builders)
            peak["builder"] = max(peak["builder"], b)
            peak["together"] = max(peak["together"], b + _rss_tree([proc.pid]))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    deadline = time.monotonic() + builder_wait
    while builder_wait and _builders() and time.monotonic() < deadline:
        time.sleep(0.5)
    stop.set()
    sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {err.strip()[-500:]}")
    return {
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "together_mb": round(peak["together"] / 2**20),
        "builder_mb": round(peak["builder"] / 2**20),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="1b")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--builder-wait", type=float, default=0.0)
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="radixchat's (default: a new temporary one)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from bench.model_1b import ensure

    model = ensure() if args.model == "1b" else Path(args.model)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    cache = args.cache_dir or Path(tempfile.mkdtemp(prefix="radixchat-mem-"))
    results: dict[str, list[dict]] = {"llama.cpp": [], "radixchat": []}
    for i in range(args.runs):
        llama = [sys.executable, "-c", LLAMA_CHILD, str(model), str(args.threads), str(args.tokens), PROMPT]
        results["llama.cpp"].append(run(llama, env))
        ours = [sys.executable, "-m", "radixchat", "-p", PROMPT, "--model", str(model), "--max-tokens",
                str(args.tokens), "--temperature", "0", "--cache-dir", str(cache)]  # fmt: skip
        results["radixchat"].append(run(ours, env, args.builder_wait))
        print(
            f"run {i + 1}: llama.cpp {results['llama.cpp'][-1]}  radixchat {results['radixchat'][-1]}",
            flush=True,
        )
    from bench.vs_llama import cpu_line

    base_rss = statistics.median(r["peak_rss_mb"] for r in results["llama.cpp"])
    base_wall = statistics.median(r["wall_s"] for r in results["llama.cpp"])
    print(f"\n{cpu_line()}; model {model.name}; {args.tokens} tokens; {args.threads} threads")
    print(
        "| start | llama.cpp wall / peak RSS | radixchat wall / peak RSS | with builder | wall ratio | RSS ratio |"
    )
    print("|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(results["llama.cpp"], results["radixchat"], strict=True)):
        print(
            f"| {i + 1} | {a['wall_s']} s / {a['peak_rss_mb']} MB | {b['wall_s']} s / {b['peak_rss_mb']} MB "
            f"| {b['together_mb']} MB (builder {b['builder_mb']} MB) | {b['wall_s'] / base_wall:.2f}× "
            f"| {b['peak_rss_mb'] / base_rss:.2f}× (together {b['together_mb'] / base_rss:.2f}×) |"
        )
    if args.json:
        args.json.write_text(
            json.dumps({"cpu": cpu_line(), "model": str(model), "results": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
