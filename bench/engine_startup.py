"""Where the engine's start-up goes (issue 11): imports, model load, first token, in a fresh process.

Run: ``python -m bench.engine_startup [--repeats 3]`` (warm caches: the model converted, the weights
probed and the decode step compiled by an earlier start). Each repeat is a new interpreter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import transformers
from transformers import AttentionInterface
t2 = time.perf_counter()
import asyncio
from radixchat.config import Settings
from radixchat.chat.engine_settings import engine_from_settings
from radixchat.engine import SamplingParams
t3 = time.perf_counter()

async def main():
    t = time.perf_counter()
    engine = engine_from_settings(Settings(kv_store=False))
    t4 = time.perf_counter()
    async with engine:
        await engine.generate([1, 2, 3], SamplingParams(max_tokens=2))
        t5 = time.perf_counter()
        stats = engine.stats(tree=False)
    print(json.dumps({"torch": t1 - t0, "transformers": t2 - t1, "radixchat": t3 - t2, "load": t4 - t,
                      "first token": t5 - t4, "ready": t5 - t0, "weights": stats.weights,
                      "compiled": stats.decode_compiled}))

asyncio.run(main())
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    runs = []
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    from radixchat.machine import cpu_isa, cpu_name

    print(f"# engine start-up — {cpu_name()} [{cpu_isa()}]; median of {args.repeats}")
    print(f"command: python -m bench.engine_startup --repeats {args.repeats}")
    print(f"weights {runs[0]['weights']}; compiled decode {runs[0]['compiled']}\n")
    phases = ["torch", "transformers", "radixchat", "load", "first token", "ready"]
    print("| " + " | ".join(phases) + " |")
    print("|" + "---|" * len(phases))
    print("| " + " | ".join(f"{statistics.median(r[p] for r in runs):.2f} s" for p in phases) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
