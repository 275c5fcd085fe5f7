"""Run the benchmark workloads: ``python -m bench.run [workload ...] [--model NAME] [--repeats N] [--json PATH]``."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from bench.common import load_models, save_json

WORKLOADS = {
    "multiturn": "bench.multiturn",
    "fanout": "bench.fanout",
    "conversations": "bench.conversations",
    "json": "bench.json_mode",
    "kv_store": "bench.kv_store",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workloads", nargs="*", choices=[*WORKLOADS, []], help="default: all")
    parser.add_argument(
        "--model",
        default="smollm2",
        help="a bundled model (smollm2, gemma3-270m) or a path (default: %(default)s)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench/results/latest.json"))
    args = parser.parse_args(argv)
    names = args.workloads or list(WORKLOADS)
    models = load_models(args.model)
    reports = []
    print(f"# radixchat benchmarks: {', '.join(names)} on {args.model} (repeats={args.repeats})")
    print(f"command: python -m bench.run {' '.join(sys.argv[1:])}".rstrip())
    for name in names:
        started = time.perf_counter()
        module = importlib.import_module(WORKLOADS[name])
        for report in module.run(models, repeats=args.repeats):
            report.print()
            reports.append(report)
        print(f"\n({name}: {time.perf_counter() - started:.0f} s)")
    save_json(reports, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
