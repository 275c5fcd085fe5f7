"""Plot per-turn TTFT of the multi-turn workload from a results JSON: ``python -m bench.plot``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=Path("bench/results/latest.json"))
    parser.add_argument("--out", type=Path, default=Path("docs/ttft_per_turn.png"))
    args = parser.parse_args(argv)
    reports = json.loads(args.json.read_text())
    turns = next((r for r in reports if r["name"].startswith("multi-turn chat")), None)
    if turns is None:
        print("no multi-turn results in", args.json)
        return 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = turns["rows"]
    x = [r["turn"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=120)
    for key, label, style in [
        ("generate_full", "transformers generate() on the full history", "s-"),
        ("dyncache_loop", "hand-written DynamicCache reuse loop", "^-"),
        ("radixchat", "radixchat (radix cache)", "o-"),
    ]:
        ax.plot(x, [r[key] for r in rows], style, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("turn")
    ax.set_ylabel("time to first token (ms, log)")
    ax.set_title("8-turn chat, ~800-token system prompt, SmolLM2-135M on CPU (float32)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
