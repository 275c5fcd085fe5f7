"""Workload 1: one conversation, ~800-token system prompt, 8 user turns, greedy up to 32 tokens (EOS ends
a reply, as in a real chat).

Per turn, interleaved in one process: radixchat (Engine + chat layer, the app's real path); a
hand-written single-conversation DynamicCache reuse loop (the practical limit for one stream); and
transformers generate() on the full history (what most hand-written chat loops do). Also decode speed:
single stream vs generate(), and 8 concurrent streams vs one.
"""

from __future__ import annotations

import asyncio
import time
import warnings

import torch

from bench.common import Models, Report, hf_generate, isolated, long_text, median
from radixchat.chat.local import LocalBackend
from radixchat.engine import Engine, EngineConfig, SamplingParams

QUESTIONS = [
    "Which rule covers rare books?",
    "Summarise it in one sentence.",
    "What about maps?",
    "Can visitors photograph manuscripts?",
    "How long can I borrow a book?",
    "Is there a fine for late returns?",
    "Who do I ask about access?",
    "Thank you, anything else I should know?",
]
NEW_TOKENS = 32


class DynamicCacheChat:
    """The hand-written baseline: one conversation, one transformers DynamicCache kept across turns."""

    def __init__(self, ref, eos_ids: frozenset[int]) -> None:
        from transformers import DynamicCache

        self.ref = ref
        self.eos_ids = eos_ids
        self.cache = DynamicCache(config=ref.config)
        self.ids: list[int] = []  # ids whose KV is in the cache

    def turn(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        assert prompt[: len(self.ids)] == self.ids, "history must be a prefix"
        new = prompt[len(self.ids) :]
        t0 = time.perf_counter()
        out = self.ref(
            input_ids=torch.tensor([new]), past_key_values=self.cache, use_cache=True, logits_to_keep=1
        )
        tok = int(out.logits[0, -1].argmax())
        ttft = time.perf_counter() - t0
        gen = [tok]
        while len(gen) < n and tok not in self.eos_ids:
            out = self.ref(input_ids=torch.tensor([[tok]]), past_key_values=self.cache, use_cache=True)
            tok = int(out.logits[0, -1].argmax())
            gen.append(tok)
        self.ids = prompt + gen[:-1]
        return gen, ttft


async def _conversation(models: Models, system: str, report_rows: list[dict], repeat: int) -> None:
    engine = Engine(models.loaded, EngineConfig(kv_pool_tokens=16384))
    async with engine:
        backend = LocalBackend(engine)
        conv = backend.new_conversation(system=system)
        dyn = engine.call(DynamicCacheChat, models.ref, models.loaded.eos_ids)
        for turn, question in enumerate(QUESTIONS):
            conv.add_user(question)
            prompt = conv.ids
            result = await backend.reply(conv, SamplingParams(max_tokens=NEW_TOKENS)).result()
            radix_ids = conv.messages[-1].token_ids
            # The baselines run on the engine's thread (see bench.common.isolated).
            dyn_ids, dyn_ttft = engine.call(dyn.turn, prompt, NEW_TOKENS)
            gen_ids, gen_ttft, _ = engine.call(hf_generate, models.ref, prompt, NEW_TOKENS, stop_at_eos=True)
            report_rows.append(
                dict(
                    repeat=repeat,
                    turn=turn + 1,
                    prompt_tokens=result.prompt_tokens,
                    prefilled=result.prefilled_tokens,
                    radix_ttft_ms=result.ttft_ms,
                    dyncache_ttft_ms=dyn_ttft * 1000,
                    generate_ttft_ms=gen_ttft * 1000,
                    same_tokens=radix_ids == dyn_ids == gen_ids,
                )
            )


async def _decode(models: Models, prompts: list[list[int]], n: int) -> tuple[float, float]:
    """(aggregate tokens/s over the wall time from submit, median per-stream decode tokens/s)."""
    engine = Engine(models.loaded, EngineConfig(kv_pool_tokens=16384))
    async with engine:
        t0 = time.perf_counter()
        results = await asyncio.gather(
            *(engine.generate(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p in prompts)
        )
        wall = time.perf_counter() - t0
    return sum(len(r.token_ids) for r in results) / wall, median([r.decode_tokens_per_s for r in results])


def run(models: Models, repeats: int = 3) -> list[Report]:
    warnings.filterwarnings("ignore")
    tok = models.tokenizer
    rows: list[dict] = []
    for rep in range(repeats):
        system = f"[session {rep}] " + long_text(tok, 800)
        asyncio.run(_conversation(models, system, rows, rep))
    turns = Report("multi-turn chat: TTFT per turn (ms, median over repeats)")
    ratios_dyn, ratios_gen8 = [], []
    for t in range(1, len(QUESTIONS) + 1):
        rs = [r for r in rows if r["turn"] == t]
        row = dict(
            turn=t,
            prompt_tokens=rs[0]["prompt_tokens"],
            prefilled=rs[0]["prefilled"],
            radixchat=median([r["radix_ttft_ms"] for r in rs]),
            dyncache_loop=median([r["dyncache_ttft_ms"] for r in rs]),
            generate_full=median([r["generate_ttft_ms"] for r in rs]),
            identical_tokens=all(r["same_tokens"] for r in rs),
        )
        row["radix/dyncache"] = row["radixchat"] / row["dyncache_loop"]
        row["generate/radix"] = row["generate_full"] / row["radixchat"]
        turns.row(**row)
        if t >= 2:
            ratios_dyn.append(row["radix/dyncache"])
        if t == len(QUESTIONS):
            ratios_gen8.append(row["generate/radix"])
    first = [r for r in rows if r["repeat"] == 0]
    turns.summary = {
        "TTFT radixchat / DynamicCache loop, turns 2-8 (median; target <= 1.25)": median(ratios_dyn),
        "TTFT generate(full history) / radixchat at turn 8 (target >= 10)": ratios_gen8[0],
        "prefilled / prompt tokens over the conversation (target <= 13%)": sum(r["prefilled"] for r in first)
        / sum(r["prompt_tokens"] for r in first),
        "greedy tokens identical across all three": all(r["same_tokens"] for r in rows),
    }

    decode = Report("decode speed (tokens/s, median over repeats)")
    prompt = tok.encode(
        tok.apply_chat_template(
            [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
            add_generation_prompt=True,
            tokenize=False,
        ),
        add_special_tokens=False,
    )
    prompts8 = [
        prompt[:-3] + tok.encode(f" variant {i}", add_special_tokens=False) + prompt[-3:] for i in range(8)
    ]
    gen_rates, one_rates, one_walls, eight_walls = [], [], [], []
    for _ in range(repeats):
        ids, ttft, total = isolated(hf_generate, models.ref, prompt, 64)
        gen_rates.append((len(ids) - 1) / (total - ttft))  # decode only: after the first token
        wall, rate = asyncio.run(_decode(models, [prompt], 64))
        one_walls.append(wall)
        one_rates.append(rate)
        eight_walls.append(asyncio.run(_decode(models, prompts8, 64))[0])
    decode.row(
        generate_decode=median(gen_rates),
        radixchat_decode=median(one_rates),
        radixchat_1_from_submit=median(one_walls),
        radixchat_8_aggregate_from_submit=median(eight_walls),
    )
    decode.summary = {
        "single stream decode radixchat / generate (target >= 1.0)": median(one_rates) / median(gen_rates),
        "8 streams aggregate / single stream, both from submit (target >= 4)": median(eight_walls)
        / median(one_walls),
    }
    return [turns, decode]
