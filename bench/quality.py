"""Teacher-forced quality next to llama.cpp on the same GGUF (issue 35): how often each engine's top-1 next token
agrees with the float32 transformers model of that file, and its next-token NLL.

Run: ``python -m bench.quality [--model smollm2|gemma3-270m|FILE.gguf] [--tokens 2000] [--window 500]``
(needs ``pip install -e .[bench]`` for llama-cpp-python).

The text is English prose the standard library ships (``prose_ids``), cut into windows that each engine reads
from an empty cache. llama.cpp multiplies its 4-bit weights with activations rounded to 8 bits per 32 inputs;
radixchat's packed model is run once per layer kernel (one kernel for every row count) with the head as
``auto`` plans it. The reference is transformers on the float32 weights of the same file, so the figures
measure each engine's arithmetic, not the file's quantization. The result is the bar of the quality guard
for radixchat's 8-bit-activation kernel (``tests/engine/test_packed.py``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

LAYER_KERNELS = ("int4", "int4-gemv", "int4-dot8", "int4-bf16")


def prose_ids(tokenizer, n_tokens: int) -> list[int]:  # noqa: ANN001
    """About ``n_tokens`` tokens of English prose: the Python language reference's own words, as the standard
    library ships them (fixed for a Python version; no file to keep in the repository)."""
    from pydoc_data.topics import topics

    text = ""
    for name in ("execmodel", "specialnames", "compound", "import"):
        text += topics[name]
        ids = tokenizer.encode(text)
        if len(ids) >= n_tokens:
            return ids[:n_tokens]
    return tokenizer.encode(text)[:n_tokens]


def _score(logits: torch.Tensor, base: torch.Tensor, ids: list[int]) -> tuple[int, float]:
    """(positions whose top-1 token is the reference's, summed next-token NLL)."""
    target = torch.tensor(ids[1:])
    agree = int((logits.argmax(-1) == base.argmax(-1)).sum())
    nll = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum").item()
    return agree, nll


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma3-270m or a .gguf file")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    from bench import vs_llama
    from radixchat.engine import packed
    from radixchat.engine import weights as W
    from radixchat.engine.loader import load_model

    vs_llama.MODEL = args.model
    gguf = vs_llama.gguf_path()
    tok = vs_llama.tokenizer()
    ids = prose_ids(tok, args.tokens)
    windows = [ids[i : i + args.window] for i in range(0, len(ids) - 1, args.window) if len(ids[i:]) > 1]
    cache = Path(tempfile.mkdtemp(prefix="radixchat-quality-"))
    exact = load_model(str(gguf), weights="float32", cache_dir=cache)
    ref = AutoModelForCausalLM.from_pretrained(
        exact.path, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    lm = load_model(str(gguf), weights="packed", cache_dir=cache)
    model = packed.load(lm.path, attn="sdpa")
    head = lm.weights.tables["head"]
    llm = Llama(str(gguf), n_ctx=args.window + 8, logits_all=True, n_threads=args.threads, verbose=False)

    totals: dict[str, list[float]] = {}
    base_nll = 0.0
    for window in windows:
        x = torch.tensor([window])
        with torch.inference_mode():
            base = ref(x, use_cache=False).logits[0, :-1].float()
        base_nll += _score(base, base, window)[1]
        llm.reset()
        llm.eval(window)
        ours = {"llama.cpp": torch.from_numpy(np.array(llm.scores[: len(window) - 1], dtype=np.float32))}
        for kernel in LAYER_KERNELS:
            W.install_plan(model, W.WeightsPlan("packed", {"layers": ((1 << 62, kernel),), "head": head}))
            with torch.inference_mode():
                ours[f"radixchat {kernel}"] = model(x, use_cache=False).logits[0, :-1].float()
        for name, logits in ours.items():
            agree, nll = _score(logits, base, window)
            t = totals.setdefault(name, [0, 0.0])
            t[0] += agree
            t[1] += nll
    positions = sum(len(w) - 1 for w in windows)
    print(
        f"# teacher-forced quality on {gguf.name}: {positions} positions in windows of {args.window} — "
        f"{vs_llama.cpu_line()}; radixchat's head: {head[0][1]}"
    )
    print(f"float32 reference NLL {base_nll / positions:.4f}")
    print("| engine | top-1 agreement with float32 | NLL | NLL vs float32 |")
    print("|---|---|---|---|")
    rows = {}
    for name, (agree, nll) in totals.items():
        rows[name] = {"agreement": agree / positions, "nll": nll / positions}
        print(
            f"| {name} | {agree / positions:.2%} | {nll / positions:.4f} | "
            f"{(nll - base_nll) / base_nll:+.2%} |"
        )
    path = args.json or Path(f"bench/results/quality_{Path(args.model).stem}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"cpu": vs_llama.cpu_line(), "positions": positions, "float32_nll": base_nll / positions}
    path.write_text(json.dumps({**result, "engines": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
