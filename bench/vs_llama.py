"""radixchat next to llama.cpp on the same CPU, the same GGUF and the same prompts (issue 11).

Run: ``python -m bench.vs_llama [--model smollm2|gemma3-270m|1b|FILE.gguf] [--big] [--threads 2] [--repeats 3] [--rounds 1] [--json PATH]`` (needs ``pip install -e .[bench]``,
which brings llama-cpp-python; .ci/run's cached build of it works too).

Each engine runs in its own process, one after the other, so that only one of them is on the CPU at a time:
- **llama.cpp** (llama-cpp-python) on the same GGUF (the bundled Q4_1 SmolLM2 by default), ``n_threads`` = the
  thread count;
- **radixchat** as a user runs it: ``weights = auto``, ``compile = auto`` (it waits, idle, until the
  background build of the compiled decode step has finished, so that the figures are the steady state);
- **radixchat float32**, the exact path (the baseline for cold prefill: "no slower than today's float32");
- **radixchat deterministic**: as a user runs it with ``deterministic = on`` (issue 33).

Workloads, greedy, the same token ids for every engine (the chat format radixchat renders for the model):
- *decode*: a story, 128 new tokens, one stream; tokens/s from the first to the last token;
- *8 streams* (radixchat only; llama-cpp-python serves one sequence): 8 different stories at once,
  aggregate tokens/s from submit to the last token, against llama.cpp's single stream;
- *chat*: 6 turns of a cached conversation, 32-token replies that each engine writes itself and keeps in its
  cache (llama-cpp-python reuses the longest common prefix of its last prompt); TTFT of turns 2-6;
- *cold prefill*: a ~1k-token prompt no engine has seen, TTFT (1 token).
Every figure is the median over ``repeats``; ratios are against llama.cpp measured in the same run.
``--rounds N`` runs the engines N times in turn (the order flipping each round) and prints each round, then each
round's decode ratio and their median: on a shared host the speed of memory drifts by the hour, and one round's
ratio compares engines measured minutes apart.

``--history`` runs the long-conversation sweep instead (issue 32): a chat of facts grown to about 0.5k, 2k, 4k
and 7.5k tokens, then a question; per length, the cold-prefill TTFT of the whole history, the decode speed
of a 64-token reply, and the TTFT of the next turn over the cached history. llama.cpp runs twice, with
flash attention off and on, and each ratio is against its better figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import SYSTEM_WORDS, fact_chat

STORY = "Write a long story about a lighthouse keeper and a storm. Use many details."
CHAT = [
    "Hi! I am planning a trip to Lisbon in spring. What should I pack?",
    "How many days would you spend there?",
    "What is a good day trip from the city?",
    "Which local dishes should I try?",
    "Is public transport easy to use?",
    "Thanks! Can you summarise the plan in three bullet points?",
]
DECODE_TOKENS = 128
REPLY_TOKENS = 32
STREAMS = 8
HISTORY_TOKENS = (500, 2000, 4000, 7500)
HISTORY_REPLY = 64
FOLLOW_UP = "Thanks. Which of these facts is the oldest?"


MODEL = "smollm2"  # --model: a bundled model's name (smollm2, gemma3-270m) or a .gguf file


def gguf_path() -> Path:
    from radixchat.bundled import bundled_model
    from radixchat.config import default_cache_dir

    if MODEL == "1b":
        from bench.model_1b import ensure

        return ensure()
    bundled = bundled_model(MODEL)
    return bundled.gguf(default_cache_dir()) if bundled is not None else Path(MODEL)


def tokenizer():
    from transformers import AutoTokenizer

    from radixchat.config import default_cache_dir
    from radixchat.engine.loader import gguf_of, resolve_model

    source = gguf_of(str(gguf_path()), default_cache_dir())
    if source is not None:  # the tokenizer alone, not a (float32) conversion of the whole model
        return AutoTokenizer.from_pretrained(str(source[1].parent), gguf_file=source[1].name)
    return AutoTokenizer.from_pretrained(resolve_model(MODEL, default_cache_dir())[1])


def chat_ids(tok, messages: list[dict]) -> list[int]:
    """The prompt as radixchat renders it (the model's template, else the built-in one chosen for it)."""
    from radixchat.chat.conversation import ChatFormat, Message

    fmt = ChatFormat(tok)
    return fmt.encode(
        fmt.render([Message(m["role"], m["content"]) for m in messages], add_generation_prompt=True)
    )


def prompts(tok) -> dict:
    cold = SYSTEM_WORDS * 30
    ids = tok(cold, add_special_tokens=False).input_ids[:1000]
    return {
        "story": chat_ids(tok, [{"role": "user", "content": STORY}]),
        "stories": [
            chat_ids(tok, [{"role": "user", "content": f"{STORY} Story number {i + 1}."}])
            for i in range(STREAMS)
        ],
        "cold": ids,
    }


def history_prompts(tok) -> list[dict]:
    """For each length: the ids of a chat of facts of about that many tokens ending in a question, and the
    ids a follow-up turn appends after the reply (the reply's own ids go between them)."""
    out = []
    for target in HISTORY_TOKENS:
        messages = fact_chat(lambda m: len(chat_ids(tok, m)), target)
        messages.append({"role": "user", "content": "List the three tallest lighthouses and their dogs."})
        prompt = chat_ids(tok, messages)
        follow = tok(
            f"<|im_end|>\n<|im_start|>user\n{FOLLOW_UP}<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        ).input_ids
        out.append({"target": target, "prompt": prompt, "follow": follow})
    return out


# -- llama.cpp --------------------------------------------------------------------------------------------


def llama_stream(llm, ids: list[int], max_tokens: int) -> tuple[float, float | None, list[int]]:  # noqa: ANN001
    """Greedy, reusing the longest common prefix it holds: (TTFT, decode tok/s, the tokens it kept)."""
    started = time.perf_counter()
    first = last = None
    n = 0
    for _ in llm.generate(ids, temp=0.0, top_k=1):
        now = time.perf_counter()
        first = first or now
        last = now
        n += 1
        if n >= max_tokens:
            break
    out = list(llm._input_ids[len(ids) :])  # noqa: SLF001 - the tokens it kept in its cache
    tps = (n - 1) / (last - first) if n > 1 and last > first else None
    return first - started, tps, out


def run_llama_history(threads: int, flash_attn: bool) -> dict:
    from llama_cpp import Llama

    tok = tokenizer()
    llm = Llama(
        model_path=str(gguf_path()),
        n_ctx=8192,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash_attn,
        verbose=False,
    )
    rows = []
    for h in history_prompts(tok):
        llm.reset()
        cold, tps, reply = llama_stream(llm, h["prompt"], HISTORY_REPLY)
        cached = llama_stream(llm, h["prompt"] + reply + h["follow"], 1)[0]
        rows.append(
            {"tokens": len(h["prompt"]), "cold_ttft_s": cold, "decode_tps": tps, "cached_ttft_s": cached}
        )
    return {"engine": f"llama.cpp (flash attention {'on' if flash_attn else 'off'})", "history": rows}


def run_llama(threads: int, repeats: int) -> dict:
    from llama_cpp import Llama

    tok = tokenizer()
    p = prompts(tok)
    llm = Llama(
        model_path=str(gguf_path()), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False
    )

    decode = []
    for _ in range(repeats):
        llm.reset()
        decode.append(llama_stream(llm, p["story"], DECODE_TOKENS)[1])
    chat_ttft: list[list[float]] = []
    for _ in range(repeats):
        llm.reset()
        history: list[dict] = []
        ttfts = []
        for turn in CHAT:
            history.append({"role": "user", "content": turn})
            ids = chat_ids(tok, history)
            ttft, _, out = llama_stream(llm, ids, REPLY_TOKENS)
            ttfts.append(ttft)
            history.append({"role": "assistant", "content": tok.decode(out, skip_special_tokens=True)})
        chat_ttft.append(ttfts)
    cold = []
    for _ in range(repeats):
        llm.reset()
        cold.append(llama_stream(llm, p["cold"], 1)[0])
    return {
        "engine": "llama.cpp",
        "decode_tps": statistics.median(decode),
        "chat_ttft": [statistics.median(t[i] for t in chat_ttft) for i in range(len(CHAT))],
        "cold_prefill_s": statistics.median(cold),
        "cold_tokens": len(p["cold"]),
    }


# -- radixchat --------------------------------------------------------------------------------------------


async def _radixchat(
    weights: str,
    compile_: str,
    repeats: int,
    wait_compiled: float,
    full: bool = True,
    deterministic: bool = False,
) -> dict:
    from radixchat.chat.engine_settings import engine_from_settings
    from radixchat.config import Settings
    from radixchat.engine import SamplingParams

    # No disk KV store: "cold" must be cold, and the chat must come from the radix tree alone.
    settings = Settings(
        model=str(gguf_path()) if MODEL == "1b" else MODEL,
        weights=weights,
        compile=compile_,
        kv_store=False,
        deterministic=deterministic,
    )
    engine = engine_from_settings(settings)
    tok = engine.tokenizer
    p = prompts(tok)
    greedy = SamplingParams(temperature=0.0, max_tokens=DECODE_TOKENS, ignore_eos=True)
    async with engine:
        await engine.generate(p["story"][:8], SamplingParams(max_tokens=2))  # warm up
        deadline = time.monotonic() + wait_compiled
        while engine.stats(tree=False).decode_compiled == "compiling" and time.monotonic() < deadline:
            await asyncio.sleep(2)
        stats = engine.stats(tree=False)
        decode = []
        for _ in range(repeats):
            engine.call(engine.core.cache.reset)
            decode.append((await engine.generate(p["story"], greedy)).decode_tokens_per_s)
        aggregate = []
        for _ in range(repeats if full else 0):
            engine.call(engine.core.cache.reset)
            started = time.perf_counter()
            handles = [engine.submit(ids, greedy) for ids in p["stories"]]
            done = [await h.result() for h in handles]
            aggregate.append(sum(len(c.token_ids) for c in done) / (time.perf_counter() - started))
        chat_ttft: list[list[float]] = []
        reply = SamplingParams(temperature=0.0, max_tokens=REPLY_TOKENS, ignore_eos=True)
        for _ in range(repeats if full else 0):
            engine.call(engine.core.cache.reset)
            history: list[dict] = []
            ttfts = []
            for turn in CHAT:
                history.append({"role": "user", "content": turn})
                c = await engine.generate(chat_ids(tok, history), reply)
                ttfts.append(c.ttft_s)
                history.append(
                    {"role": "assistant", "content": tok.decode(c.token_ids, skip_special_tokens=True)}
                )
            chat_ttft.append(ttfts)
        cold = []
        for _ in range(repeats):
            engine.call(engine.core.cache.reset)
            cold.append((await engine.generate(p["cold"], SamplingParams(max_tokens=1))).ttft_s)
    return {
        "engine": f"radixchat ({stats.weights}{', compiled' if stats.decode_compiled == 'ready' else ''})",
        "weights": stats.weights,
        "decode_compiled": stats.decode_compiled,
        "decode_tps": statistics.median(decode),
        "aggregate_tps": statistics.median(aggregate) if aggregate else None,
        "chat_ttft": [statistics.median(t[i] for t in chat_ttft) for i in range(len(CHAT))]
        if chat_ttft
        else None,
        "cold_prefill_s": statistics.median(cold),
        "cold_tokens": len(p["cold"]),
    }


async def _radixchat_history(wait_compiled: float) -> dict:
    from radixchat.chat.engine_settings import engine_from_settings
    from radixchat.config import Settings
    from radixchat.engine import SamplingParams

    # As a user runs it, but without the disk KV store: cold must be cold, the next turn from the tree alone.
    engine = engine_from_settings(Settings(model=MODEL, kv_store=False))
    tok = engine.tokenizer
    greedy = SamplingParams(temperature=0.0, max_tokens=HISTORY_REPLY, ignore_eos=True)
    rows = []
    async with engine:
        await engine.generate(tok("Hello").input_ids, SamplingParams(max_tokens=2))  # warm up
        deadline = time.monotonic() + wait_compiled
        while engine.stats(tree=False).decode_compiled == "compiling" and time.monotonic() < deadline:
            await asyncio.sleep(2)
        stats = engine.stats(tree=False)
        for h in history_prompts(tok):
            engine.call(engine.core.cache.reset)
            c = await engine.generate(h["prompt"], greedy)
            follow = await engine.generate(
                h["prompt"] + c.token_ids + h["follow"], SamplingParams(max_tokens=1)
            )
            rows.append(
                {
                    "tokens": len(h["prompt"]),
                    "cold_ttft_s": c.ttft_s,
                    "decode_tps": c.decode_tokens_per_s,
                    "cached_ttft_s": follow.ttft_s,
                }
            )
    return {
        "engine": f"radixchat ({stats.weights}; KV {stats.kv_dtype}; attention {stats.decode_attention}"
        f"{'; compiled' if stats.decode_compiled == 'ready' else ''})",
        "decode_compiled": stats.decode_compiled,
        "history": rows,
    }


# -- the parent: one engine per process, one at a time ----------------------------------------------------


def child(args: argparse.Namespace) -> dict:
    # The thread count comes from OMP_NUM_THREADS (the parent sets it). Never torch.set_num_threads here:
    # on the main thread it starts a second OpenMP team beside the engine's, and with more OpenMP threads
    # than cores every kernel of the engine's thread slows down, which would handicap radixchat's figures.
    if args.child in ("llama-history", "llama-fa-history"):
        return run_llama_history(args.threads, flash_attn=args.child == "llama-fa-history")
    if args.child == "auto-history":
        return asyncio.run(_radixchat_history(args.wait_compiled))
    if args.child == "llama":
        return run_llama(args.threads, args.repeats)
    weights, compile_ = {"float32": ("float32", "off"), "eager": ("auto", "off")}.get(
        args.child, ("auto", "auto")
    )
    # The float32 baseline is there for decode and cold prefill ("no slower than today's float32").
    full = args.child in ("auto", "deterministic", "eager")
    return asyncio.run(
        _radixchat(
            weights,
            compile_,
            args.repeats,
            args.wait_compiled,
            full,
            deterministic=args.child == "deterministic",
        )
    )


CHILDREN = [
    "llama", "auto", "float32", "deterministic", "eager", "llama-history", "llama-fa-history", "auto-history"
]  # fmt: skip


def cpu_line() -> str:
    from radixchat.machine import cpu_isa, cpu_name

    return f"{cpu_name()} [{cpu_isa()}], {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--wait-compiled", type=float, default=900, help="seconds to wait for the compiled decode"
    )
    parser.add_argument(
        "--history", action="store_true", help="the long-conversation sweep (0.5k to 7.5k tokens of history)"
    )
    parser.add_argument(
        "--model",
        default="smollm2",
        help="a bundled model (smollm2, gemma3-270m), 1b (bench/model_1b.py's file) or a .gguf file, for both",
    )
    parser.add_argument(
        "--big",
        action="store_true",
        help="a model brought by a user (issue 35): llama.cpp, radixchat compiled and eager, no float32 runs",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the engines this many times in turn, the order flipping each round (the host's speed drifts "
        "by the hour: each round's ratios come from engines measured minutes apart), and print each round",
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", choices=CHILDREN, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global MODEL
    MODEL = args.model
    if args.child:
        print(json.dumps(child(args)))
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    if args.history:
        names: tuple[str, ...] = ("llama-history", "llama-fa-history", "auto-history")
    else:
        names = ("llama", "auto", "eager") if args.big else ("llama", "auto", "float32", "deterministic")
    rounds = []
    for i in range(args.rounds):
        results = _run_children(names[::-1] if i % 2 else names, args, env)
        if results is None:
            return 1
        if args.rounds > 1:
            print(f"\n## round {i + 1} of {args.rounds} ({', '.join(results)} in that order)\n")
        (report_history if args.history else report_big if args.big else report)(results, args)
        rounds.append(results)
    if args.rounds > 1 and not args.history:
        _report_rounds(rounds, eager=args.big)
    model = "" if args.model == "smollm2" else "_" + Path(args.model).stem
    args.json = args.json or Path(f"bench/results/vs_llama{model}{'_history' if args.history else ''}.json")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    data = {"cpu": cpu_line(), "threads": args.threads, "results": rounds[0]}
    if args.rounds > 1:
        data["rounds"] = rounds
    args.json.write_text(json.dumps(data, indent=2))
    return 0


def _run_children(names: tuple[str, ...], args: argparse.Namespace, env: dict) -> dict | None:
    """Each engine's measurements, one child process each, in the order of ``names`` (None: one failed)."""
    results = {}
    for name in names:
        cmd = [
            sys.executable,
            "-m",
            "bench.vs_llama",
            "--child",
            name,
            "--threads",
            str(args.threads),
            "--repeats",
            str(args.repeats),
            "--wait-compiled",
            str(args.wait_compiled),
            "--model",
            args.model,
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            return None
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def _report_rounds(rounds: list[dict], eager: bool) -> None:
    """Each round's decode speeds and ratio, and the median ratio over the rounds."""
    print(f"\n## decode over {len(rounds)} rounds\n")
    print(
        "| round | llama.cpp (tok/s) | radixchat (tok/s) | ratio |"
        + (" eager (tok/s) | eager ratio |" if eager else "")
    )
    print("|---|---|---|---|" + ("---|---|" if eager else ""))
    ratios, eager_ratios = [], []
    for i, r in enumerate(rounds, 1):
        base, ours = r["llama"]["decode_tps"], r["auto"]["decode_tps"]
        ratios.append(ours / base)
        row = f"| {i} | {base:.1f} | {ours:.1f} | {ours / base:.2f}× |"
        if eager:
            e = r["eager"]["decode_tps"]
            eager_ratios.append(e / base)
            row += f" {e:.1f} | {e / base:.2f}× |"
        print(row)
    line = f"\nmedian decode ratio **{statistics.median(ratios):.2f}×** (range {min(ratios):.2f}–{max(ratios):.2f}×)"
    if eager:
        line += f"; eager **{statistics.median(eager_ratios):.2f}×** ({min(eager_ratios):.2f}–{max(eager_ratios):.2f}×)"
    print(line)


def report_history(results: dict, args: argparse.Namespace) -> None:
    off, on, ours = results["llama-history"], results["llama-fa-history"], results["auto-history"]
    print(
        f"# long conversations: radixchat vs llama.cpp on {args.model} — {cpu_line()}; {args.threads} threads"
    )
    print(f"command: python -m bench.vs_llama --model {args.model} --history --threads {args.threads}\n")
    print(f"radixchat: {ours['engine']}\n")
    print(
        "| history (tokens) | llama.cpp decode, FA off / on (tok/s) | radixchat decode (tok/s) | **decode ratio** "
        "| cold TTFT llama.cpp / radixchat (s) | **cold ratio** | cached-turn TTFT llama.cpp / radixchat (ms) "
        "| cached ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for a, b, r in zip(off["history"], on["history"], ours["history"]):
        best_tps = max(a["decode_tps"], b["decode_tps"])
        best_cold = min(a["cold_ttft_s"], b["cold_ttft_s"])
        best_cached = min(a["cached_ttft_s"], b["cached_ttft_s"])
        print(
            f"| {r['tokens']} | {a['decode_tps']:.1f} / {b['decode_tps']:.1f} | {r['decode_tps']:.1f} | "
            f"**{r['decode_tps'] / best_tps:.2f}×** | {best_cold:.2f} / {r['cold_ttft_s']:.2f} | "
            f"**{r['cold_ttft_s'] / best_cold:.2f}×** | {best_cached * 1e3:.0f} / {r['cached_ttft_s'] * 1e3:.0f} | "
            f"{r['cached_ttft_s'] / best_cached:.2f}× |"
        )
    first, last = (
        r["decode_tps"] / max(a["decode_tps"], b["decode_tps"])
        for a, b, r in (
            (off["history"][0], on["history"][0], ours["history"][0]),
            (off["history"][-1], on["history"][-1], ours["history"][-1]),
        )
    )
    print(f"\ndecode ratio at the longest history / at the shortest: **{last / first:.2f}** (target ≥ 0.9)")


def _header(args: argparse.Namespace, auto: dict, flags: str) -> None:
    print(
        f"# radixchat vs llama.cpp on {args.model} — {cpu_line()}; {args.threads} threads; median of {args.repeats}"
    )
    print(
        f"command: python -m bench.vs_llama {flags}--model {args.model} --threads {args.threads} "
        f"--repeats {args.repeats}\n"
    )
    print(f"radixchat: weights {auto['weights']}; compiled decode: {auto['decode_compiled']}\n")


def report_big(results: dict, args: argparse.Namespace) -> None:
    """Issue 35's table: a model a user brings, next to llama.cpp on its own GGUF."""
    llama, auto, eager = results["llama"], results["auto"], results["eager"]
    _header(args, auto, "--big ")
    print("| | llama.cpp | radixchat | radixchat eager | radixchat / llama.cpp | target |")
    print("|---|---|---|---|---|---|")
    d, e = (r["decode_tps"] / llama["decode_tps"] for r in (auto, eager))
    print(
        f"| decode, 1 stream (tok/s) | {llama['decode_tps']:.1f} | {auto['decode_tps']:.1f} | "
        f"{eager['decode_tps']:.1f} | **{d:.2f}×** (eager {e:.2f}×) | ≥ 1.3×, also eager |"
    )
    lt, rt, et = (statistics.mean(r["chat_ttft"][1:]) * 1e3 for r in (llama, auto, eager))
    print(
        f"| chat TTFT, turns 2–6, mean (ms) | {lt:.0f} | {rt:.0f} | {et:.0f} | **{rt / lt:.2f}×** | ≤ 1.0× |"
    )
    lc, rc, ec = (r["cold_prefill_s"] * 1e3 for r in (llama, auto, eager))
    print(
        f"| cold prefill, {auto['cold_tokens']} tokens (ms) | {lc:.0f} | {rc:.0f} | {ec:.0f} | "
        f"**{rc / lc:.2f}×** | ≤ 0.5× |"
    )
    a = auto["aggregate_tps"] / llama["decode_tps"]
    print(
        f"| decode, {STREAMS} streams aggregate (tok/s) | {llama['decode_tps']:.1f} (1 stream) | {auto['aggregate_tps']:.1f} | {eager['aggregate_tps']:.1f} | {a:.2f}× | – |"
    )


def report(results: dict, args: argparse.Namespace) -> None:
    llama, auto, f32 = results["llama"], results["auto"], results["float32"]
    _header(args, auto, "")
    print("| | llama.cpp | radixchat | radixchat float32 | radixchat / llama.cpp | target |")
    print("|---|---|---|---|---|---|")
    d = auto["decode_tps"] / llama["decode_tps"]
    print(
        f"| decode, 1 stream (tok/s) | {llama['decode_tps']:.1f} | {auto['decode_tps']:.1f} | "
        f"{f32['decode_tps']:.1f} | **{d:.2f}×** | ≥ 0.5× |"
    )
    a = auto["aggregate_tps"] / llama["decode_tps"]
    print(
        f"| decode, {STREAMS} streams aggregate (tok/s) | {llama['decode_tps']:.1f} (1 stream) | "
        f"{auto['aggregate_tps']:.1f} | – | **{a:.2f}×** | ≥ 1.5× |"
    )
    lt, rt = (statistics.mean(r["chat_ttft"][1:]) * 1e3 for r in (llama, auto))
    print(f"| chat TTFT, turns 2–6, mean (ms) | {lt:.0f} | {rt:.0f} | – | **{rt / lt:.2f}×** | ≤ 1.0× |")
    lc, rc, fc = (r["cold_prefill_s"] * 1e3 for r in (llama, auto, f32))
    print(
        f"| cold prefill, {auto['cold_tokens']} tokens (ms) | {lc:.0f} | {rc:.0f} | {fc:.0f} | "
        f"{rc / lc:.2f}× (vs float32: **{rc / fc:.2f}×**) | ≤ 1.0× float32 |"
    )
    det = results["deterministic"]
    dd, dc = det["decode_tps"], statistics.mean(det["chat_ttft"][1:]) * 1e3
    print(
        f"\nwith deterministic = on ({det['weights']}, eager): decode {dd:.1f} tok/s "
        f"(**{dd / llama['decode_tps']:.2f}×** llama.cpp, {dd / auto['decode_tps']:.2f}× the default), "
        f"8 streams {det['aggregate_tps']:.1f} tok/s, chat TTFT turns 2–6 {dc:.0f} ms "
        f"(**{dc / lt:.2f}×** llama.cpp), cold prefill {det['cold_prefill_s'] * 1e3:.0f} ms"
    )
    print(
        "\nchat TTFT per turn (ms): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{t * 1e3:.0f}" for t in r["chat_ttft"])
            for name, r in results.items()
            if r["chat_ttft"]
        )
    )


if __name__ == "__main__":
    sys.exit(main())
