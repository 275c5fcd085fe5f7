"""The decode step as compiled code: the eager per-op cost of a small model, removed.

A decode step of a 135M model runs ~2,000 small eager ops (norms, RoPE, views, attention bookkeeping); on a
CPU they cost as much as the matrix products. AOTInductor (``torch.export`` + inductor, ahead of time) turns
the step into one C++ function. It covers pure-decode steps only (every request feeds one token; steps with
prefill chunks stay eager) in two graphs: one stream, and 2..N streams, where N is the largest batch for
which the weights plan keeps the same kernels (a kernel switch is a shape guard the export cannot span).
Context length and pool size are dynamic.

Compiling costs minutes of CPU, so it never happens in the serving process: at first start on a machine, the
engine starts a background process (niced, one thread) that loads the same model and weights plan, exports
and compiles the graphs into ``<cache_dir>/compiled/<key>/``, and exits. Until the graphs exist, decoding
runs eager; the engine picks them up between steps and from then on, and at every later start, loads them in
well under a second. The packages hold code only: the model's own tensors are handed to them at load time
(user-managed constants), so nothing is copied and nothing big is written to disk. The key covers everything
the compiled code depends on (model files, dtype, weights plan, torch and transformers versions, CPU, and
the source of the modules traced), so a stale graph is never loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from radixchat.engine.attention import AttentionBatch
from radixchat.engine.model_size import FLOAT32_BYTES, GIB, available_memory, parameter_count

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often a serving engine looks for graphs a builder has finished
MAX_CONTEXT_DIM = 1 << 20
MAX_SLOTS_DIM = 1 << 31


class _PoolView:
    """What the attention function reads of a pool: per-layer K and V tensors."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor]) -> None:
        self.k, self.v = k, v


class DecodeStep(nn.Module):
    """One pure-decode forward as a function of tensors only (what gets exported)."""

    def __init__(self, model: nn.Module, paged: bool = False) -> None:
        super().__init__()
        self.model = model
        self.paged = paged  # attention reads the pool in place (the native kernel, called from the graph)

    def forward(
        self,
        input_ids: torch.Tensor,  # [1, B]
        positions: torch.Tensor,  # [1, B]
        out_slots: torch.Tensor,  # [B]
        decode_slots: torch.Tensor,  # [B, L]
        decode_lens: torch.Tensor,  # [B]
        k: list[torch.Tensor],
        v: list[torch.Tensor],
    ) -> torch.Tensor:
        streams = input_ids.shape[1]
        meta = AttentionBatch(
            pool=_PoolView(k, v),  # type: ignore[arg-type]
            out_slots=out_slots,
            n_decode=streams,
            decode_slots=decode_slots,
            decode_lens=decode_lens,
            decode_uniform=streams == 1,  # several streams: always masked, so one graph serves them all
            paged=self.paged,
        )
        return self.model(input_ids=input_ids, position_ids=positions, use_cache=False, radix=meta).logits


def compile_unavailable(model: nn.Module, device: torch.device, paged: bool) -> str | None:
    """Why the decode step cannot be compiled here (None: it can). ``paged``: attention reads the pool in place
    (the native kernel), which takes a sliding window as an argument; gathered attention masks the window
    only once the context outgrows it, a branch on the context length that the export cannot span."""
    if device.type != "cpu":
        return "the compiled decode step is built for the CPU only"
    sliding = getattr(model.config, "sliding_window", None) and getattr(
        model.config, "use_sliding_window", True
    )
    if sliding and not paged:
        return "sliding-window attention without the native attention kernel makes the context length a guard"
    if not any(shutil.which(c) for c in (os.environ.get("CXX") or "g++", "g++", "c++")):
        return "no C++ compiler (g++) for inductor"
    return None


def stream_ranges(plan_tables: dict[str, Any], max_streams: int) -> list[tuple[int, int]]:
    """One stream, then 2..N streams while every table keeps its first kernel (at most ``max_streams``)."""
    bound = min((rows[0][0] for rows in plan_tables.values()), default=max_streams)
    hi = min(bound, max_streams)
    return [(1, 1)] + ([(2, hi)] if hi >= 2 else [])


def _source_digest() -> str:
    """The code the graphs were traced through: ours and the transformers version."""
    import transformers

    from radixchat.engine import attention, kernels, weights

    h = hashlib.sha256()
    for mod in (attention, weights, sys.modules[__name__]):
        h.update(Path(mod.__file__).read_bytes())
    h.update(kernels.SOURCES[0].read_bytes())  # the paged attention (the graphs call it)
    h.update(transformers.__version__.encode())
    return h.hexdigest()[:16]


def _model_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.glob("*")):
        if f.is_file() and f.suffix in (".safetensors", ".json", ".pt"):  # .pt: a packed model's weights
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class BuildSpec:
    """Everything a builder process needs to rebuild the same model and graphs."""

    model_path: str
    dtype: str
    plan: dict[str, Any]  # WeightsPlan.as_json()
    ranges: list[tuple[int, int]]
    kv_dtype: str = "float32"  # the pool's dtype (the graphs read and write it)
    paged: bool = False  # decode attention through the native kernel

    @property
    def key(self) -> str:
        from radixchat.machine import cpu_isa, cpu_name

        parts = json.dumps(
            [
                _model_digest(Path(self.model_path)),
                self.dtype,
                self.plan,
                self.ranges,
                self.kv_dtype,
                self.paged,
                torch.__version__,
                cpu_name(),
                cpu_isa(),
                _source_digest(),
            ],
            sort_keys=True,
        )
        return hashlib.sha256(parts.encode()).hexdigest()[:20]


def build_spec(lm: Any, kv_dtype: torch.dtype, paged: bool, max_streams: int) -> BuildSpec:
    """The graphs an engine over ``lm`` (a ``LoadedModel``) needs, with this pool dtype and attention."""
    return BuildSpec(
        str(lm.path),
        str(lm.dtype).removeprefix("torch."),
        lm.weights.as_json(),
        stream_ranges(lm.weights.tables, max_streams),
        str(kv_dtype).removeprefix("torch."),
        paged,
    )


def package_name(lo: int, hi: int) -> str:
    return f"decode-{lo}-{hi}.pt2"


class DecodeGraphs:
    """The compiled decode graphs of one engine: loaded if built, else built by a background process."""

    def __init__(
        self,
        model: nn.Module,
        spec: BuildSpec,
        cache_dir: Path,
        *,
        build: bool = True,
    ) -> None:
        self.step = DecodeStep(model, spec.paged)
        self.spec = spec
        self.dir = cache_dir / "compiled" / spec.key
        self.state = "compiling"
        self._graphs: dict[tuple[int, int], Any] = {}
        self._next_poll = 0.0
        self._constants: dict[str, torch.Tensor] | None = None
        self._builder: subprocess.Popen | None = None  # the builder this engine started
        #: The builder this engine pauses while busy: its own, or one that another process started and left
        #: running (a chat quit before its build finished, then a second start).
        self._builder_pid: int | None = None
        self._held = False
        self.poll(force=True)
        if self.state == "compiling" and build:
            self._start_builder(cache_dir)

    # -- serving --------------------------------------------------------------------------------------

    def lookup(self, streams: int) -> Any | None:
        if self.state == "compiling":
            self.poll()
        for (lo, hi), graph in self._graphs.items():
            if lo <= streams <= hi:
                return graph
        return None

    def poll(self, force: bool = False) -> None:
        """Load graphs that a builder has finished (cheap: a few stat calls, at most every POLL_S)."""
        now = time.monotonic()
        if not force and now < self._next_poll:
            return
        self._next_poll = now + POLL_S
        failed = self.dir / "failed.txt"
        if failed.is_file():
            self.state = "failed: " + failed.read_text(errors="replace").strip().splitlines()[0][:200]
            return
        for lo, hi in self.spec.ranges:
            path = self.dir / package_name(lo, hi)
            if (lo, hi) not in self._graphs and path.is_file():
                try:
                    self._graphs[(lo, hi)] = self._load(path)
                except Exception as exc:  # a damaged package: say so, and keep decoding eager
                    self.state = f"failed: cannot load {path.name}: {type(exc).__name__}: {exc}"[:240]
                    log.warning("%s", self.state)
                    return
        if len(self._graphs) == len(self.spec.ranges):
            self.state = "ready"
        elif self._builder is not None and self._builder.poll() not in (None, 0):
            self.state = f"failed: the builder process exited with {self._builder.returncode}"

    def _load(self, path: Path) -> Any:
        from safetensors import safe_open

        graph = _load_package(path)
        if self._constants is None:
            self._constants = module_tensors(self.step)
        # Tensors the trace lifted that are neither parameters nor buffers (small: RoPE frequencies, say).
        # The serving model's own tensors are never read from the file (packages built before this was
        # so carry copies of the non-persistent weight buffers: reading them doubled memory and start-up).
        constants = dict(self._constants)
        with safe_open(str(path.with_suffix(".constants.safetensors")), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors file, not a dict: it has no __iter__)
                if name not in constants:
                    constants[name] = f.get_tensor(name)
        graph.load_constants(
            {name: constants[name] for name in graph.get_constant_fqns()},
            check_full_update=True,
            user_managed=True,
        )
        return graph

    def hold_builder(self, busy: bool) -> None:
        """Pause our builder while the engine has work, and let it go on when the engine is idle.

        With two cores, a compiler running beside a decode step (even niced) stalls the step's OpenMP
        threads, which spin-wait for each other: decode fell from ~50 to ~1 token/s. A chat engine is idle
        most of the time, so the build still finishes in a few minutes of wall time."""
        pid = self._builder_pid
        if pid is None or busy == self._held:
            return
        if not self._builder_alive(pid):
            self._builder_pid = None
            return
        try:
            os.killpg(pid, signal.SIGSTOP if busy else signal.SIGCONT)  # its compiler children too
            self._held = busy
        except OSError:
            self._builder_pid = None

    def _builder_alive(self, pid: int) -> bool:
        if self._builder is not None:
            return self._builder.poll() is None  # our child: reaped when it ends
        return _is_builder(pid, self.dir / "spec.json")

    def close(self) -> None:
        """Never leave a paused builder behind: it goes on (and finishes) after the engine is gone."""
        self.hold_builder(False)

    def _start_builder(self, cache_dir: Path) -> None:
        short = builder_memory_problem(Path(self.spec.model_path))
        if short is not None:  # a builder would push the machine into swap or the OOM killer
            self.state = f"off: {short}"
            log.info("not compiling the decode step: %s", short)
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = self.dir / "building.pid"
        spec_file = self.dir / "spec.json"
        try:
            pid = int(lock.read_text())
        except (OSError, ValueError):
            pid = None
        if pid is not None and _is_builder(pid, spec_file):
            # Another process is building these graphs already: let it go on (an engine that paused it
            # may have died without letting it go), and pause it while this engine is busy, as our own.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGCONT)
            self._builder_pid = pid
            atexit.register(self.close)
            return
        spec_file.write_text(json.dumps({"spec": _spec_dict(self.spec), "cache_dir": str(cache_dir)}))
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "TORCHINDUCTOR_COMPILE_THREADS": "1",
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        }
        with open(self.dir / "build.log", "ab") as logf:
            self._builder = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from radixchat.engine.decode_graph import main; "
                    "sys.exit(main(sys.argv[1:]))",
                    str(spec_file),
                ],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # outlives a Ctrl-C of the app: the next start finds the graphs
                preexec_fn=_be_nice,
            )
        lock.write_text(str(self._builder.pid))
        self._builder_pid = self._builder.pid
        atexit.register(self.close)
        log.info("building the compiled decode step in the background (pid %d)", self._builder.pid)


#: What a builder holds per float32 byte of the model: its own float32 copy of the weights, the packed
#: format's, and inductor's traced constants (measured: 9.3 GB for a 1.2B-parameter model).
BUILDER_MEMORY_FACTOR = 2.0


#: A packed model's builder maps the same weights file as the app (shared pages) and needs this much beside.
PACKED_BUILDER_BYTES = 3 << 29


def builder_memory_problem(model_path: Path) -> str | None:
    """Why a builder for the model at ``model_path`` should not start now (None: the memory is there)."""
    from radixchat.engine.packed import WEIGHTS_FILE, is_packed

    if is_packed(model_path):
        need, have = (model_path / WEIGHTS_FILE).stat().st_size + PACKED_BUILDER_BYTES, available_memory()
        return (
            None
            if need <= have
            else f"its builder needs about {need / GIB:.1f} GiB and {have / GIB:.1f} GiB is available"
        )
    params = parameter_count(model_path)
    if params is None:
        return None
    need, have = int(params * FLOAT32_BYTES * BUILDER_MEMORY_FACTOR), available_memory()
    if need <= have:
        return None
    return f"its builder needs about {need / GIB:.1f} GiB of memory and {have / GIB:.1f} GiB is available"


def _is_builder(pid: int, spec_file: Path) -> bool:
    """Whether ``pid`` is a live builder of ``spec_file`` (a stale lock's pid may belong to anything now,
    and that must never be paused). Read from /proc; where there is none, no other process's builder is
    adopted."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    # the spec's own directory names it (its key); the rest of the path may be written another way
    name = os.fsencode(os.path.join(spec_file.parent.name, spec_file.name))
    return state != "Z" and any(arg.endswith(name) for arg in cmdline)


def module_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers by name (remove_duplicate=False: a tied LM head is one tensor under two
    names, and a graph asks for both). Non-persistent buffers (the weights formats' copies) included."""
    return {
        **dict(module.named_parameters(remove_duplicate=False)),
        **dict(module.named_buffers(remove_duplicate=False)),
    }


def _load_package(path: Path) -> Any:
    """``torch._inductor.aoti_load_package`` without its device check, which compiles and runs ISA test
    programs at every start only to warn on a mismatch that our key already rules out."""
    try:
        from torch.export.pt2_archive._package import AOTICompiledModel

        return AOTICompiledModel(
            torch._C._aoti.AOTIModelPackageLoader(str(_unpacked(path)), "model", False, 1, -1)
        )
    except (ImportError, AttributeError, TypeError):  # another torch: its public loader
        return torch._inductor.aoti_load_package(str(path))


def _unpacked(path: Path) -> Path:
    """The package's files, unpacked once beside it. The loader would otherwise extract the archive into a
    new ``/tmp/aotinductor_*`` at every start, removed only when it is destroyed: a process that is killed
    or exits without collecting it left its files in /tmp at every start."""
    out = path.with_suffix(".unpacked")
    if not out.is_dir():
        tmp = path.parent / f".tmp-{os.getpid()}-{out.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(path) as archive:
            archive.extractall(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process unpacked it first
            shutil.rmtree(tmp, ignore_errors=True)
    roots = [p for p in out.iterdir() if p.is_dir()]
    return roots[0] if len(roots) == 1 else out  # the archive's one top folder is the package


def _be_nice() -> None:
    os.nice(19)


def _spec_dict(spec: BuildSpec) -> dict[str, Any]:
    return {
        "model_path": spec.model_path,
        "dtype": spec.dtype,
        "plan": spec.plan,
        "ranges": spec.ranges,
        "kv_dtype": spec.kv_dtype,
        "paged": spec.paged,
    }


# -- the builder process ----------------------------------------------------------------------------------


def _example(streams: int, shape: Any) -> tuple[Any, ...]:
    """Example inputs for the export (``shape``: a ``KVShape``); 8 pool slots, a 4-token context."""
    slots = (8, shape.num_kv_heads, shape.head_dim)
    k = [torch.zeros(slots, dtype=shape.dtype) for _ in range(shape.num_layers)]
    v = [torch.zeros(slots, dtype=shape.dtype) for _ in range(shape.num_layers)]
    ids = torch.zeros((1, streams), dtype=torch.int64)
    return (
        ids,
        torch.full((1, streams), 3, dtype=torch.int64),
        torch.full((streams,), 3, dtype=torch.int64),
        torch.arange(4, dtype=torch.int64).repeat(streams, 1),
        torch.full((streams,), 4, dtype=torch.int64),
        k,
        v,
    )


def build(spec: BuildSpec, out_dir: Path, cache_dir: Path) -> None:
    """Load the model of ``spec`` as the serving engine does, and compile its graphs (the builder process)."""
    from radixchat.engine.kernels import load_paged_attention
    from radixchat.engine.loader import load_model
    from radixchat.engine.weights import WeightsPlan, install_plan

    if spec.paged and (why := load_paged_attention(cache_dir)) is not None:
        raise RuntimeError(f"the paged attention kernel is unavailable here: {why}")
    lm = load_model(spec.model_path, device="cpu", dtype=spec.dtype, weights="float32", cache_dir=cache_dir)
    install_plan(lm.model, WeightsPlan.from_json(spec.plan))
    compile_graphs(lm.model, spec.ranges, out_dir, kv_dtype=getattr(torch, spec.kv_dtype), paged=spec.paged)


def compile_graphs(
    model: nn.Module,
    ranges: list[tuple[int, int]],
    out_dir: Path,
    *,
    kv_dtype: torch.dtype | None = None,
    paged: bool = False,
) -> None:
    """Export and compile one graph per stream range of ``model`` (weights plan installed) into ``out_dir``,
    over a pool of ``kv_dtype`` (default: the model's dtype)."""
    from safetensors.torch import save_file
    from torch.export import Dim

    from radixchat.engine.kv_pool import KVShape

    config = model.config
    heads = config.num_attention_heads
    shape = KVShape(
        config.num_hidden_layers,
        getattr(config, "num_key_value_heads", None) or heads,
        getattr(config, "head_dim", None) or config.hidden_size // heads,
        kv_dtype or next(model.parameters()).dtype,
    )
    step = DecodeStep(model, paged).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = Dim("context", min=2, max=MAX_CONTEXT_DIM)
    pool = Dim("slots", min=2, max=MAX_SLOTS_DIM)
    pools = [{0: pool}] * shape.num_layers
    with torch.inference_mode():
        for lo, hi in ranges:
            target = out_dir / package_name(lo, hi)
            if target.is_file():
                continue
            if lo == hi:
                s: Any = {}
                dims = ({}, {}, {}, {1: ctx}, {}, pools, pools)
            else:
                s = Dim("streams", min=lo, max=hi)
                dims = ({1: s}, {1: s}, {0: s}, {0: s, 1: ctx}, {0: s}, pools, pools)
            started = time.perf_counter()
            program = torch.export.export(step, _example(lo, shape), dynamic_shapes=dims, strict=False)
            tmp = out_dir / f".tmp-{os.getpid()}-{target.name}"  # inductor wants a name ending in .pt2
            with _recording_inductor_constants() as made:
                torch._inductor.aoti_compile_and_package(
                    program,
                    package_path=str(tmp),
                    inductor_configs={"aot_inductor.package_constants_in_so": False},
                )
            # The package holds code only; parameters and buffers come from the serving model. The few small
            # tensors the export lifted (RoPE frequencies) or inductor made (int4 group sizes) are saved beside
            # it, written first: the package's appearance tells a serving engine the graph is complete.
            own = module_tensors(step)  # export lifts non-persistent buffers into constants too
            lifted = {
                name: t
                for name, t in program.constants.items()
                if isinstance(t, torch.Tensor) and name not in own
            }
            lifted |= made
            constants_tmp = out_dir / f".tmp-{os.getpid()}-constants"
            save_file({name: t.detach().contiguous() for name, t in lifted.items()}, str(constants_tmp))
            os.replace(constants_tmp, target.with_suffix(".constants.safetensors"))
            os.replace(tmp, target)
            print(f"built {target.name} in {time.perf_counter() - started:.0f} s", flush=True)


class _recording_inductor_constants:
    """Record the tensor constants inductor creates while lowering (names like ``constant12``), which a
    package built without its constants needs at load time. Only ever used in the builder process."""

    def __enter__(self) -> dict[str, torch.Tensor]:
        from torch._inductor.graph import GraphLowering

        self._orig = orig = GraphLowering.allocate_non_dup_const_name
        made: dict[str, torch.Tensor] = {}

        def record(graph: Any, name: str | None, data: torch.Tensor) -> str:
            new = orig(graph, name, data)
            if name is None and isinstance(data, torch.Tensor):
                made[new] = data
            return new

        GraphLowering.allocate_non_dup_const_name = record  # type: ignore[method-assign]
        return made

    def __exit__(self, *exc: object) -> None:
        from torch._inductor.graph import GraphLowering

        GraphLowering.allocate_non_dup_const_name = self._orig  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    spec_file = Path(argv[0])
    data = json.loads(spec_file.read_text())
    raw = data["spec"]
    spec = BuildSpec(
        raw["model_path"],
        raw["dtype"],
        raw["plan"],
        [tuple(r) for r in raw["ranges"]],
        raw.get("kv_dtype", raw["dtype"]),
        bool(raw.get("paged", False)),
    )
    out_dir = spec_file.parent
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    try:
        build(spec, out_dir, Path(data["cache_dir"]))
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        (out_dir / "failed.txt").write_text(reason[:500] + "\n")
        print(f"failed: {reason}", flush=True)
        return 1
    finally:
        (out_dir / "building.pid").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
