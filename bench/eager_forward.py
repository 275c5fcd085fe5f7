"""The eager decode step three ways, in one process (issue 35): transformers' forward, the lean forward in
Python, and the lean forward's native decode step; decode speed and the tokens.

One engine (``weights = auto``, the compiled decode step off: this is the eager step, what runs before the
compiled step exists). Rounds rotate the model runner's three forwards (``engine/lean.py``), the order
shifting every round, each a 300-token prompt (cache reset first) and 48 greedy tokens. Prints the median
decode speed of each and whether every reply had the same tokens (the three are bit-identical:
``tests/engine/test_lean.py``).

Run: ``python -m bench.eager_forward [--model smollm2|gemma3-270m|1b|FILE.gguf] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

import bench.vs_llama as V


async def _measure(rounds: int) -> dict[str, list[float]]:
    from radixchat.chat.engine_settings import engine_from_settings
    from radixchat.config import Settings
    from radixchat.engine import SamplingParams

    model = str(V.gguf_path()) if V.MODEL == "1b" else V.MODEL
    engine = engine_from_settings(Settings(model=model, weights="auto", compile="off", kv_store=False))
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    prompt = list(range(100, 400))
    names = ("transformers", "lean", "native")
    speed: dict[str, list[float]] = {name: [] for name in names}
    replies: dict[str, set[tuple[int, ...]]] = {name: set() for name in names}
    async with engine:
        await engine.generate(prompt[:8], SamplingParams(max_tokens=2))  # warm-up
        runner = engine.core.runner
        lean = runner.lean
        if lean is None:
            raise SystemExit(f"{model}: its architecture has no lean forward (transformers runs it)")
        print(f"weights {engine.stats(tree=False).weights}", flush=True)
        for i in range(rounds):
            for name in names[i % 3 :] + names[: i % 3]:

                def use(name: str = name) -> None:
                    runner.lean = None if name == "transformers" else lean
                    runner.native_decode = name == "native"
                    engine.core.cache.reset()

                engine.call(use)
                done = await engine.generate(prompt, greedy)
                speed[name].append(done.decode_tokens_per_s or 0.0)
                replies[name].add(tuple(done.token_ids))
    same = all(replies[name] == replies["lean"] for name in names) and len(replies["lean"]) == 1
    print(f"same tokens: {same}")
    return speed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-270m", help="smollm2, gemma3-270m, 1b or a .gguf file")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    V.MODEL = args.model
    from radixchat.machine import cpu_isa, cpu_name

    print(f"# eager decode: transformers, lean, native — {cpu_name()} [{cpu_isa()}]; model {args.model}")
    print(f"command: python -m bench.eager_forward --model {args.model} --rounds {args.rounds}")
    speed = asyncio.run(_measure(args.rounds))
    median = {name: statistics.median(xs) for name, xs in speed.items()}
    print("\n| forward | decode tok/s, median | / transformers | rounds |\n|---|---|---|---|")
    for name, xs in speed.items():
        rounds = ", ".join(f"{x:.1f}" for x in xs)
        print(f"| {name} | {median[name]:.1f} | {median[name] / median['transformers']:.2f}× | {rounds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
