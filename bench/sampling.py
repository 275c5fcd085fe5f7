"""Sampling keeps up with greedy decoding: decode tokens/s with the chat's default sampling settings against
greedy, in one engine, on the same prompt.

Every decode figure elsewhere in bench/ is greedy, but a chat samples (``temperature 0.2, top_p 0.9,
repetition_penalty 1.1`` by default, ``config.Settings``), and what sampling costs a step is paid per token.
Rounds alternate greedy and sampled replies (the order flipping every
round), each a 300-token prompt (cache reset first) and 96 tokens (``ignore_eos``); the ratio of medians is the
figure (target ≥ 0.95). ``--history N`` puts N tokens of history before the reply (the repetition penalty
covers every prompt token).

Run: ``python -m bench.sampling [--model smollm2|gemma3-270m|1b|FILE.gguf] [--rounds 3] [--history 0]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

import bench.vs_llama as V


async def _measure(rounds: int, history: int) -> dict[str, list[float]]:
    from radixchat.chat.engine_settings import engine_from_settings
    from radixchat.config import Settings
    from radixchat.engine import SamplingParams

    settings = Settings(model=str(V.gguf_path()) if V.MODEL == "1b" else V.MODEL, kv_store=False)
    engine = engine_from_settings(settings)
    params = {
        "greedy": SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True),
        "sampled": SamplingParams(
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            repetition_penalty=settings.repetition_penalty,
            max_tokens=96,
            ignore_eos=True,
            seed=1,
        ),
    }
    prompt = [100 + (i * 7919) % 20000 for i in range(300 + history)]
    speed: dict[str, list[float]] = {name: [] for name in params}
    async with engine:
        await engine.generate(prompt[:8], SamplingParams(max_tokens=2))  # warm-up
        print(f"weights {engine.stats(tree=False).weights}; {params['sampled']}", flush=True)
        for i in range(rounds):
            for name in ("greedy", "sampled") if i % 2 == 0 else ("sampled", "greedy"):
                engine.call(engine.core.cache.reset)
                done = await engine.generate(prompt, params[name])
                speed[name].append(done.decode_tokens_per_s or 0.0)
    return speed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma3-270m, 1b or a .gguf file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history", type=int, default=0, help="tokens of history before the reply")
    args = parser.parse_args(argv)
    V.MODEL = args.model
    from radixchat.machine import cpu_isa, cpu_name

    print(f"# sampled vs greedy decode — {cpu_name()} [{cpu_isa()}]; model {args.model}")
    print(
        f"command: python -m bench.sampling --model {args.model} --rounds {args.rounds} --history {args.history}"
    )
    speed = asyncio.run(_measure(args.rounds, args.history))
    median = {name: statistics.median(xs) for name, xs in speed.items()}
    print("\n| decode | tok/s, median | rounds |\n|---|---|---|")
    for name, xs in speed.items():
        print(f"| {name} | {median[name]:.1f} | {', '.join(f'{x:.1f}' for x in xs)} |")
    print(f"\nsampled / greedy: **{median['sampled'] / median['greedy']:.2f}×** (target ≥ 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
