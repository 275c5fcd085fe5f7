"""Shared helpers: loading a model twice (radix and sdpa; SmolLM2 unless told), timing, and reporting ratios.

Machines here are noisy: every figure is reported next to a baseline measured in the same run, as a
ratio of medians over repeats.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from radixchat.config import default_cache_dir
from radixchat.engine.loader import LoadedModel, load_model

SYSTEM_WORDS = (
    "You are a meticulous assistant for a research library. Answer precisely, cite the relevant section of "
    "the catalogue rules when asked, and keep answers short unless the user asks for detail. "
)


@dataclass
class Models:
    loaded: LoadedModel  # radix attention, for the engine
    ref: Any  # the same weights with sdpa, for transformers baselines
    tokenizer: Any


def isolated(fn, *args, **kwargs):
    """Run ``fn`` on a fresh thread that ends afterwards, and return its result.

    Fairness rule of these benchmarks: at any moment only one live thread has run torch kernels (an
    engine's own thread, or one of these). With PyTorch's OpenMP runtime each such thread keeps a worker
    pool, and with more pool threads than cores every kernel in every thread gets slower (see
    radixchat/engine/engine.py). The main thread therefore never runs torch; baselines measured next to
    a live engine run on the engine's thread (``Engine.call``)."""
    box: dict = {}

    def target() -> None:
        torch.set_grad_enabled(False)
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    thread = threading.Thread(target=target, name="bench-torch")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def _load(model: str) -> Models:
    from transformers import AutoModelForCausalLM

    loaded = load_model(model, device="cpu", dtype="float32", cache_dir=default_cache_dir())
    ref = AutoModelForCausalLM.from_pretrained(
        loaded.path, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    return Models(loaded, ref, loaded.tokenizer)


def load_models(model: str = "smollm2") -> Models:
    """``model``: a bundled model's name (smollm2, gemma3-270m) or a path, as ``load_model`` takes."""
    return isolated(_load, model)


def long_text(tokenizer, n_tokens: int, seed_words: str = SYSTEM_WORDS) -> str:
    """Deterministic filler prose of about ``n_tokens`` tokens."""
    text, i = "", 0
    while len(tokenizer.encode(text, add_special_tokens=False)) < n_tokens:
        i += 1
        text += f"Rule {i}. " + seed_words
    return text


def fact_chat(count_tokens, target: int) -> list[dict]:  # noqa: ANN001
    """A chat of facts (system prompt, then user facts each acknowledged) of at most about ``target`` tokens
    with room for one more question; ``count_tokens(messages)`` renders and counts. The long-conversation
    benches (vs_llama --history, long_session, app_speed --history) share it."""
    messages: list[dict] = [{"role": "system", "content": "You are a careful archivist. Keep every fact."}]
    i = 0
    while True:
        i += 1
        fact = (
            f"Fact {i}: the lighthouse of harbour {i} was built in {1700 + 7 * i % 300}, is "
            f"{12 + i % 40} metres tall and its keeper's dog is called Rover {i}."
        )
        trial = messages + [
            {"role": "user", "content": fact},
            {"role": "assistant", "content": f"Noted fact {i}."},
        ]
        if count_tokens(trial + [{"role": "user", "content": "?"}]) > target:
            return messages
        messages = trial


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


class Timer:
    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self.t0


@dataclass
class Report:
    """A table on stdout and a JSON blob, with the command that produced it."""

    name: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def row(self, **values: Any) -> None:
        self.rows.append(values)

    def print(self) -> None:
        print(f"\n## {self.name}\n")
        if self.rows:
            cols = list(self.rows[0])
            print("| " + " | ".join(cols) + " |")
            print("|" + "---|" * len(cols))
            for r in self.rows:
                print("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
        if self.summary:
            print()
            for k, v in self.summary.items():
                print(f"- {k}: {_fmt(v)}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rows": self.rows, "summary": self.summary}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def save_json(reports: list[Report], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([r.as_dict() for r in reports], indent=2))


class FirstTokenStreamer:
    """A transformers streamer that records when generate() produced its first new token."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first: float | None = None
        self._calls = 0

    def put(self, value: Any) -> None:
        self._calls += 1
        if self._calls == 2 and self.first is None:  # the first put() is the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass

    @property
    def ttft(self) -> float:
        assert self.first is not None
        return self.first - self.started


def hf_generate(
    ref, ids: list[int], max_new_tokens: int, stop_at_eos: bool = False
) -> tuple[list[int], float, float]:
    """Greedy generate(); returns (new ids, ttft seconds, total seconds)."""
    eos = {} if stop_at_eos else {"eos_token_id": None}  # None: run the full length, like ignore_eos
    streamer = FirstTokenStreamer()
    t0 = time.perf_counter()
    out = ref.generate(
        torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=0,
        streamer=streamer,
        **eos,
    )
    return out[0, len(ids) :].tolist(), streamer.ttft, time.perf_counter() - t0
