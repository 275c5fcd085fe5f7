"""MaskBench (guidance-ai/jsonschemabench) on radixchat's grammar engine, with llguidance and xgrammar as peers.

    .venv/bin/pip install -e ".[bench]"          # llguidance, xgrammar (bench extra only)
    .venv/bin/python -m bench.maskbench          # 1,000-schema stratified sample, all three engines
    .venv/bin/python -m bench.maskbench --tokenizer gemma3-270m   # the same on Gemma's 262k vocabulary

Data (never committed): the JSON files of ``maskbench/data`` in a checkout of guidance-ai/jsonschemabench
(``git clone --depth 1`` it, then ``--data jsonschemabench/maskbench/data``, or a checkout's root). The
default is ``$RADIXCHAT_MASKBENCH_DATA``, else ``~/.cache/radixchat/maskbench/data``. Each file holds one
schema and test instances flagged ``valid``.

Method (the same for every engine):
- vocabulary: ``--tokenizer``'s, the same for every engine: SmolLM2's (the bundled model's, 49,152 ids,
  EOS ``<|im_end|>``) by default, Gemma 3 270M's (``gemma3-270m``: 262,144 ids, EOS ``<end_of_turn>``,
  id 106) or an HF tokenizer folder's. The EOS is the token that ends a chat reply: the first of the
  engine's end-of-turn tokens (``radixchat.engine.loader.END_OF_TURN``) the vocabulary has as one
  token, else the tokenizer's ``eos_token`` (Gemma's ``<eos>``, id 1, ends a document, not a reply);
- each instance is written as compact JSON (``separators=(",", ":")``, ``ensure_ascii=False``) and
  tokenized once by that tokenizer; every engine sees the same ids;
- per token: compute the mask (timed twice: wall time, and the process's CPU time, every thread
  counted, which leaves out what other load on the machine took), check the token's bit, then commit
  it; after the last token the
  mask is computed once more and its EOS bit says whether the instance is complete (MaskBench's own
  runner skips this last check, so it counts valid prefixes as accepted; we do not);
- "passing" is MaskBench's metric: the schema compiles, every valid instance is accepted and every
  invalid one rejected. Valid accepted / invalid rejected are over the instances of compiled schemas;
- cold masks: each schema is compiled fresh (no per-grammar cache survives from another schema); what
  an engine keeps per tokenizer (radixchat's lexer-state runs, llguidance's token trie, xgrammar's
  tokenizer info) stays warm over the run, as in a server;
- the sample: files grouped by MaskBench's dataset folder (the name before ``---``, or before
  ``_<n>.json``), ``--sample`` schemas drawn with ``--seed`` in proportion to each folder's size, at least
  ``--min-per-folder`` from each (all of a smaller folder);
- each engine runs in its own worker process (one thread) with ``--time-limit`` seconds per schema; a
  schema that overruns it (or crashes the worker) counts as a compile failure ("timeout").

radixchat runs strict (the default API): a schema with a keyword the grammar cannot enforce does not
compile. xgrammar runs as MaskBench's default "xgr" engine (``strict_mode=True``, no extra whitespace),
with compact separators to match the instances.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ENGINES = ("radixchat", "llguidance", "xgrammar")
RESULTS = Path(__file__).parent / "results"


def default_data() -> Path:
    env = os.environ.get("RADIXCHAT_MASKBENCH_DATA")
    return Path(env) if env else Path.home() / ".cache" / "radixchat" / "maskbench" / "data"


def data_dir(path: Path) -> Path:
    for cand in (path, path / "maskbench" / "data", path / "data"):
        if cand.is_dir() and any(cand.glob("*---*.json")):
            return cand
    sys.exit(
        f"maskbench: no MaskBench data in {path}: clone guidance-ai/jsonschemabench and pass "
        "--data <checkout>/maskbench/data (see bench/maskbench.py)"
    )


def folder_of(name: str) -> str:
    return name.split("---")[0] if "---" in name else re.sub(r"_\d+\.json$", "", name)


def stratified_sample(files: list[Path], n: int, seed: int, min_per: int) -> list[Path]:
    groups: dict[str, list[Path]] = defaultdict(list)
    for f in sorted(files):
        groups[folder_of(f.name)].append(f)
    total = len(files)
    rng = random.Random(seed)
    out: list[Path] = []
    for name in sorted(groups):
        g = groups[name]
        k = min(len(g), max(min_per, round(n * len(g) / total)))
        out += rng.sample(g, k)
    return out


def load_tokenizer(name: str):
    """``(tokenizer, eos id)`` for ``--tokenizer``: a model alias (its converted folder) or an HF
    tokenizer folder."""
    from transformers import AutoTokenizer

    from radixchat.config import default_cache_dir
    from radixchat.engine.loader import END_OF_TURN, resolve_model

    folder = Path(name) if Path(name).is_dir() else resolve_model(name, default_cache_dir())[1]
    tok = AutoTokenizer.from_pretrained(folder)
    vocab = tok.get_vocab()
    eos = next((vocab[t] for t in END_OF_TURN if t in vocab), tok.eos_token_id)
    if eos is None:
        sys.exit(f"maskbench: the tokenizer in {folder} has no end-of-turn or EOS token")
    return tok, eos


def records(out: Path, tokenizer: str, name: str) -> Path:
    """Where one engine's records go: SmolLM2's keep their old names."""
    slug = "" if tokenizer == "smollm2" else re.sub(r"[^A-Za-z0-9.]+", "-", Path(tokenizer).name) + "-"
    return out / f"maskbench-{slug}{name}.jsonl"


# -- engines ---------------------------------------------------------------------------------------


class Radixchat:
    def __init__(self, tok, vocab: int, eos: int, additional: str = "auto", order: str = "schema") -> None:
        from radixchat.grammar import TokenizerInfo

        self.info = TokenizerInfo.from_tokenizer(tok, vocab_size=vocab, eos_ids=[eos])
        self.additional = additional
        self.order = order

    def compile(self, schema) -> None:
        import warnings

        from radixchat.grammar import compile_json_schema

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.g = compile_json_schema(
                schema,
                self.info,
                cache=False,
                additional_properties=self.additional,
                property_order=self.order,
            )

    def start(self) -> None:
        self.m = self.g.matcher()

    def mask(self):
        return self.m.allowed().numpy()

    @staticmethod
    def bit(mask, t: int) -> bool:
        return bool(mask[t])

    def commit(self, t: int) -> None:
        self.m.advance(t)


class Llguidance:
    def __init__(self, tok, vocab: int, eos: int) -> None:
        import llguidance
        import llguidance.hf
        from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

        self.llg = llguidance
        self.tok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab, eos_token=eos)
        self.buf = allocate_token_bitmask(1, self.tok.vocab_size)
        self.fill = fill_next_token_bitmask

    def compile(self, schema) -> None:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        self.m0 = self.llg.LLMatcher(self.tok, grammar)
        if self.m0.is_error():
            raise ValueError(self.m0.get_error())

    def start(self) -> None:
        self.m = self.m0.deep_copy()

    def mask(self):
        self.fill(self.m, self.buf, 0)
        return self.buf

    @staticmethod
    def bit(mask, t: int) -> bool:
        return bool((int(mask[0, t // 32]) >> (t % 32)) & 1)

    def commit(self, t: int) -> None:
        if not self.m.consume_token(t):
            raise ValueError(self.m.get_error())


class Xgrammar:
    def __init__(self, tok, vocab: int, eos: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab, stop_token_ids=[eos])
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.buf = xgr.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, schema) -> None:
        self.cg = self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=(",", ":"), strict_mode=True
        )

    def start(self) -> None:
        self.m = self.xgr.GrammarMatcher(self.cg)

    def mask(self):
        self.m.fill_next_token_bitmask(self.buf)
        return self.buf

    @staticmethod
    def bit(mask, t: int) -> bool:
        return bool((int(mask[0, t // 32]) >> (t % 32)) & 1)

    def commit(self, t: int) -> None:
        if not self.m.accept_token(t):
            raise ValueError("token rejected")


def make_engine(name: str, tok, vocab: int, eos: int):
    if name.startswith("radixchat-ap-"):  # radixchat-ap-<additional_properties>[-any]: other readings
        additional, _, order = name.removeprefix("radixchat-ap-").partition("-")
        return Radixchat(tok, vocab, eos, additional=additional, order=order or "schema")
    return {"radixchat": Radixchat, "llguidance": Llguidance, "xgrammar": Xgrammar}[name](tok, vocab, eos)


# -- the worker: one engine over a list of files ---------------------------------------------------


def run_instance(engine, ids: list[int], eos: int, times: list[int], cpu: list[int] | None = None) -> bool:
    """Run one instance; each mask's wall time goes to ``times``, its CPU time (every thread of the
    process) to ``cpu``."""
    cpu = [] if cpu is None else cpu
    engine.start()
    for t in [*ids, None]:
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        mask = engine.mask()
        times.append(time.perf_counter_ns() - t0)
        cpu.append(time.process_time_ns() - c0)
        if t is None:
            return engine.bit(mask, eos)
        if not engine.bit(mask, t):
            return False
        engine.commit(t)
    raise AssertionError("unreachable")


def worker(name: str, tokenizer: str, files: list[str], out: Path, time_limit: int) -> None:
    tok, eos = load_tokenizer(tokenizer)
    vocab = len(tok)
    engine = make_engine(name, tok, vocab, eos)
    if name.startswith("radixchat"):
        gc.freeze()  # as the CLI does once the model is loaded (radixchat.chat.loading.settled_heap)
    with open(out, "a") as f:
        for path in files:
            data = json.loads(Path(path).read_text())
            f.write(json.dumps({"start": Path(path).name}) + "\n")
            f.flush()
            signal.alarm(time_limit)  # default action: the worker ends, the parent records a timeout
            rec: dict = {"file": Path(path).name, "folder": folder_of(Path(path).name)}
            t0 = time.perf_counter_ns()
            try:
                engine.compile(data["schema"])
                rec["compile_ns"] = time.perf_counter_ns() - t0
            except Exception as exc:
                rec["compile_error"] = f"{type(exc).__name__}: {exc}"[:300]
            if "compile_error" not in rec:
                times: list[int] = []
                cpu: list[int] = []
                results = []
                for test in data.get("tests", []):
                    text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
                    ids = tok.encode(text, add_special_tokens=False)
                    try:
                        ok = run_instance(engine, ids, eos, times, cpu)
                        err = None
                    except Exception as exc:
                        ok, err = False, f"{type(exc).__name__}: {exc}"[:200]
                    results.append([bool(test["valid"]), ok, err])
                rec["tests"] = results
                rec["mask_ns"] = times
                rec["mask_cpu_ns"] = cpu
            signal.alarm(0)
            f.write(json.dumps(rec) + "\n")
            f.flush()
    gc.unfreeze()  # as the CLI does on its way out (frozen extension objects are reported as leaks)


def run_engine(
    name: str, tokenizer: str, files: list[Path], out: Path, time_limit: int, resume: bool = False
) -> None:
    """Run the worker until every file has a record; a schema that kills it is recorded as a timeout.
    ``resume`` keeps the records already in ``out`` and runs only the files without one."""
    if not resume:
        out.unlink(missing_ok=True)
    have = set()
    if out.exists():
        have = {json.loads(line).get("file") for line in out.read_text().splitlines()}
    todo = [str(f) for f in files if f.name not in have]
    while todo:
        lst = out.with_suffix(".todo")
        cmd = [
            sys.executable,
            "-m",
            "bench.maskbench",
            "--worker",
            name,
            "--tokenizer",
            tokenizer,
            "--files",
            str(lst),
            "--out",
            str(out),
        ]
        lst.write_text("\n".join(todo))
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
        lst.unlink(missing_ok=True)
        done, started = set(), None
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            if "start" in rec:
                started = rec["start"]
            else:
                done.add(rec["file"])
                started = None
        if started is not None and started not in done:
            reason = "timeout" if proc.returncode == -signal.SIGALRM else f"worker died ({proc.returncode})"
            with open(out, "a") as f:
                f.write(
                    json.dumps({"file": started, "folder": folder_of(started), "compile_error": reason})
                    + "\n"
                )
            done.add(started)
        elif proc.returncode != 0:
            sys.exit(f"maskbench: the {name} worker failed before any schema (exit {proc.returncode})")
        todo = [t for t in todo if Path(t).name not in done]


# -- the table -------------------------------------------------------------------------------------


def summarize(path: Path) -> dict:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    recs = [r for r in recs if "file" in r]
    compiled = [r for r in recs if "compile_error" not in r]
    passing = sum(all(valid == ok for valid, ok, _ in r["tests"]) for r in compiled)
    valid = [ok for r in compiled for v, ok, _ in r["tests"] if v]
    invalid = [ok for r in compiled for v, ok, _ in r["tests"] if not v]
    masks = np.array([t for r in compiled for t in r["mask_ns"]], dtype=np.int64)
    cpu = np.array([t for r in compiled for t in r.get("mask_cpu_ns", ())], dtype=np.int64)
    comp = np.array([r["compile_ns"] for r in compiled], dtype=np.int64)

    def pct(a, q):
        return float(np.percentile(a, q)) if a.size else float("nan")

    return {
        "schemas": len(recs),
        "compiled": len(compiled),
        "passing": passing,
        "valid": (sum(valid), len(valid)),
        "invalid_accepted": sum(invalid),
        "invalid": len(invalid),
        "mask_us": (pct(masks, 50) / 1e3, pct(masks, 99) / 1e3, (masks.max() / 1e3 if masks.size else 0.0)),
        "masks": int(masks.size),
        "mask_cpu_us": (pct(cpu, 99) / 1e3, (cpu.max() / 1e3 if cpu.size else float("nan"))),
        "compile_ms": (pct(comp, 50) / 1e6, pct(comp, 99) / 1e6, (comp.max() / 1e6 if comp.size else 0.0)),
    }


def _us(x: float) -> str:
    return f"{x / 1e3:.2f} ms" if x >= 1000 else f"{x:.0f} µs" if x >= 10 else f"{x:.1f} µs"


def table(summaries: dict[str, dict]) -> str:
    rows = [
        "| engine | compiled | passing | valid accepted | invalid rejected | mask p50 / p99 / max (cold) "
        "| mask CPU p99 / max | compile p50 / p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        va, vn = s["valid"]
        rej = s["invalid"] - s["invalid_accepted"]
        m50, m99, mmax = s["mask_us"]
        c50, c99, _ = s["compile_ms"]
        p99, pmax = s["mask_cpu_us"]
        rows.append(
            f"| {name} | {s['compiled']}/{s['schemas']} | **{s['passing']}** ({100 * s['passing'] / s['schemas']:.1f}%) "
            f"| {100 * va / max(vn, 1):.1f}% ({va}/{vn}) "
            f"| {100 * rej / max(s['invalid'], 1):.1f}% ({s['invalid_accepted']} accepted) "
            f"| {_us(m50)} / {_us(m99)} / {_us(mmax)} | {_us(p99)} / {_us(pmax)} | {c50:.1f} ms / {c99:.0f} ms |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data", type=Path, default=default_data(), help="MaskBench data dir (default: %(default)s)"
    )
    ap.add_argument("--sample", type=int, default=1000, help="schemas in the stratified sample (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-per-folder", type=int, default=10)
    ap.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma-separated: " + ", ".join(ENGINES) + "; radixchat-ap-true / radixchat-ap-false read an "
        "absent additionalProperties as JSON Schema does / as false (radixchat's default is auto), and "
        "radixchat-ap-true-any also takes members in any order (property_order='any'): JSON Schema's reading",
    )
    ap.add_argument(
        "--tokenizer",
        default="smollm2",
        help="every engine's vocabulary: smollm2, gemma3-270m (262k ids) or an HF tokenizer folder "
        "(default: %(default)s)",
    )
    ap.add_argument("--time-limit", type=int, default=120, help="seconds per schema and engine")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the per-schema records go")
    ap.add_argument("--table-only", action="store_true", help="print the table of existing records")
    ap.add_argument(
        "--resume", action="store_true", help="keep existing records, run only the missing schemas"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--files", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.tokenizer, args.files.read_text().splitlines(), args.out, args.time_limit)
        return
    engines = [e for e in args.engines.split(",") if e]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        files = sorted(data_dir(args.data).glob("*.json"))
        sample = (
            files
            if args.sample == 0
            else stratified_sample(files, args.sample, args.seed, args.min_per_folder)
        )
        print(f"maskbench: {len(sample)} of {len(files)} schemas, seed {args.seed}", file=sys.stderr)
        for name in engines:
            t0 = time.time()
            out = records(args.out, args.tokenizer, name)
            run_engine(name, args.tokenizer, sample, out, args.time_limit, args.resume)
            print(f"maskbench: {name} done in {time.time() - t0:.0f} s", file=sys.stderr)
    print(table({name: summarize(records(args.out, args.tokenizer, name)) for name in engines}))


if __name__ == "__main__":
    main()
