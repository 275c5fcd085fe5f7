"""EngineCore: the synchronous heart of the engine — schedule, forward, sample, update.

It owns the KV pool, the radix tree, the request table, the scheduler, the model runner and the
sampler, and is driven by exactly one thread (``Engine``'s worker, or a test calling ``step()``).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from radixchat.engine.attention import PAGED_HEAD_DIMS, paged_decode_usable
from radixchat.engine.batch import ScheduledBatch
from radixchat.engine.decode_graph import POLL_S, DecodeGraphs, build_spec, compile_unavailable
from radixchat.engine.detokenizer import Detokenizer
from radixchat.engine.kernels import load_paged_attention
from radixchat.engine.kv_dtype import resolve_kv_dtype
from radixchat.engine.kv_pool import KVPool, KVShape, ReqToTokenTable
from radixchat.engine.kvstore import KVLoadResult, KVSaveResult, KVStoreUsage, KVTier, Spiller, open_store
from radixchat.engine.kvstore.tier import Run
from radixchat.engine.loader import LoadedModel
from radixchat.engine.model_runner import ModelRunner
from radixchat.engine.prefetch import apply_prefetch
from radixchat.engine.prefix_cache import NodeInfo, NoReuseCache, PrefixCache
from radixchat.engine.radix_cache import RadixCache
from radixchat.engine.request import (
    Event,
    FinishReason,
    Request,
    SamplingParams,
    TokenEvent,
    TokenMatcher,
    validate_prompt,
)
from radixchat.engine.sampler import FAILED, Sampler
from radixchat.engine.scheduler import Scheduler
from radixchat.engine.stats import SchedulerCounters
from radixchat.errors import ConfigError, PromptTooLongError, RequestError

CPU_DEFAULT_POOL_TOKENS = 32768


@dataclass(frozen=True, slots=True)
class EngineConfig:
    kv_pool_tokens: int | None = None
    kv_memory_fraction: float = 0.85
    max_running_requests: int = 32
    chunked_prefill_size: int = 512
    schedule_policy: str = "lpm"
    radix_cache: bool = True
    debug: bool = False
    kv_store_dir: Path | None = None  # the disk store below the tree (None: off); needs radix_cache
    kv_store_bytes: int = 2 << 30
    kv_spill: bool = True  # write KV evicted from the pool to the store, load it back on a hit
    # "auto": compile the decode step on CPU when the weights are a compact format (float32 stays the exact,
    # eager path); "on"; "off". See decode_graph.py (graphs are built by a background process, once).
    compile: str = "off"
    cache_dir: Path | None = None  # for the compiled decode step, native kernels and this machine's probes
    # The KV pool's dtype: None is the model's (the exact path), "auto" is measured per machine (kv_dtype.py).
    kv_dtype: str | None = None
    # How far ahead the native decode products prefetch their codes: "auto" measured per machine (prefetch.py),
    # "off" none, None as they are.
    code_prefetch: str | None = None
    # Batch invariance: every token through one code path (eager; decode and prefill through the same
    # attention kernel). The model's weights plan must be deterministic too (load_model(deterministic=True)).
    deterministic: bool = False


@dataclass(frozen=True, slots=True)
class CoreSnapshot:
    """``EngineCore.snapshot``: what ``Engine.stats`` reports of the core, copied out under the state lock."""

    running: int
    waiting: int
    counters: SchedulerCounters  # a copy
    steps: int
    pool_capacity: int
    pool_free: int
    kv_dtype: str
    bytes_per_token: int
    tree_tokens: int
    tree_evictable: int
    tree_protected: int
    tree_version: int
    nodes: list[NodeInfo]


def wants_compile(setting: str, lm: LoadedModel, deterministic: bool = False) -> bool:
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"compile must be auto, on or off, got {setting!r}")
    if deterministic:  # the compiled step's fused code sums in another order than the eager prefill's
        return False
    if setting == "auto":
        return lm.device.type == "cpu" and lm.weights.format != "float32"
    return setting == "on"


def pool_capacity(lm: LoadedModel, cfg: EngineConfig, shape: KVShape) -> int:
    if cfg.kv_pool_tokens is not None:
        return cfg.kv_pool_tokens
    if lm.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(lm.device)
        return max(1024, int(free * cfg.kv_memory_fraction) // shape.bytes_per_token)
    return CPU_DEFAULT_POOL_TOKENS


class EngineCore:
    def __init__(self, lm: LoadedModel, cfg: EngineConfig | None = None) -> None:
        self.lm = lm
        self.cfg = cfg = cfg or EngineConfig()
        kernels = (
            load_paged_attention(cfg.cache_dir) if lm.device.type == "cpu" else "the device is not a CPU"
        )
        self.paged_decode = paged_decode_usable(lm.head_dim, lm.device)
        if kernels is None:  # how far ahead the native decode products prefetch their codes
            apply_prefetch(cfg.code_prefetch, cfg.cache_dir)
        kv_dtype = resolve_kv_dtype(
            cfg.kv_dtype,
            lm.dtype,
            lm.device,
            (lm.model.config.num_attention_heads, lm.num_kv_heads, lm.head_dim),
            cfg.cache_dir,
            hold=cfg.deterministic,
        )
        shape = KVShape(lm.num_layers, lm.num_kv_heads, lm.head_dim, kv_dtype)
        self.pool = KVPool(shape, pool_capacity(lm, cfg, shape), lm.device)
        self.max_total_len = min(lm.max_context, self.pool.capacity)
        self.table = ReqToTokenTable(cfg.max_running_requests, self.max_total_len, lm.device)
        # Built in order of need: the store and the spiller come first because the tree is built with its
        # eviction callback, the tier needs the tree, and the scheduler extends its matches through the tier.
        counters = SchedulerCounters()
        store = None
        if cfg.kv_store_dir is not None and cfg.radix_cache:
            store = open_store(lm, shape, cfg.kv_store_dir, cfg.kv_store_bytes)
        spiller = Spiller(store, self.pool, counters) if store is not None and cfg.kv_spill else None
        self.cache: PrefixCache
        self.kv_tier: KVTier | None = None
        if cfg.radix_cache:
            tree = RadixCache(self.pool, on_evict=spiller.spill if spiller is not None else None)
            if store is not None:
                self.kv_tier = KVTier(store, self.pool, tree, counters, spiller)
            self.cache = tree
        else:
            self.cache = NoReuseCache(self.pool)  # the ablation: every prompt is computed in full
        self.scheduler = Scheduler(
            self.pool,
            self.table,
            self.cache,
            max_running=cfg.max_running_requests,
            chunk_size=cfg.chunked_prefill_size,
            policy=cfg.schedule_policy,
            counters=counters,
            kv_tier=self.kv_tier,
        )
        # Prefill chunks read the pool in place as well, in bfloat16, when it is half precision (the fast path;
        # a float32 pool keeps SDPA, the exact path the equality tests hold).
        paged_extend = self.paged_decode and lm.dtype == torch.float32
        paged_extend = paged_extend and (kv_dtype != torch.float32 or cfg.deterministic)
        if cfg.deterministic and not paged_extend:
            why = kernels or (
                f"head_dim {lm.head_dim} is not one of {PAGED_HEAD_DIMS}"
                if lm.head_dim not in PAGED_HEAD_DIMS
                else "the model's dtype is not float32"
            )
            raise ConfigError(f"deterministic inference needs the native attention kernels ({why})")
        self.decode_state = "off"
        graphs = None
        if wants_compile(cfg.compile, lm, cfg.deterministic):
            why = compile_unavailable(lm.model, lm.device, self.paged_decode) or (
                "no cache directory" if cfg.cache_dir is None else None
            )
            if why is None:
                assert cfg.cache_dir is not None
                spec = build_spec(lm, kv_dtype, self.paged_decode, cfg.max_running_requests)
                graphs = DecodeGraphs(lm.model, spec, cfg.cache_dir)
            else:
                self.decode_state = f"failed: {why}"
        self.runner = ModelRunner(
            lm.model,
            self.pool,
            self.table,
            paged=self.paged_decode,
            paged_extend=paged_extend,
            unified=cfg.deterministic,
            decode_graphs=graphs,
        )
        self.sampler = Sampler(lm.vocab_size, set(lm.eos_ids))
        self._backend_tokenizer = getattr(lm.tokenizer, "backend_tokenizer", None)
        self._rids = itertools.count(1)
        self.steps = 0
        self.forward_s = 0.0  # time inside the model forward (the rest of a step is overhead)
        self.step_s = 0.0

    # -- requests -------------------------------------------------------------------------------------

    def make_request(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        matcher: TokenMatcher | None = None,
    ) -> Request:
        """Validate and build a request (raises RequestError / PromptTooLongError; nothing is queued)."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise RequestError("params must be a SamplingParams")
        ids = validate_prompt(prompt_ids, self.lm.vocab_size)
        if len(ids) >= self.lm.max_context:
            raise PromptTooLongError(
                f"prompt of {len(ids)} tokens does not fit the model's context of {self.lm.max_context} tokens"
            )
        if len(ids) >= self.pool.capacity:
            raise PromptTooLongError(
                f"prompt of {len(ids)} tokens does not fit the KV pool of {self.pool.capacity} tokens "
                "(raise --kv-pool-tokens)"
            )
        if matcher is not None and not isinstance(matcher, TokenMatcher):
            raise RequestError(
                "grammar must provide allowed(), advance(), is_accepting() and is_terminated()"
            )
        req = Request(next(self._rids), ids, params, matcher=matcher, max_total_len=self.max_total_len)
        if params.seed is not None:
            req.generator = torch.Generator(device=self.lm.device).manual_seed(params.seed)
        req.detok = Detokenizer(self._backend_tokenizer, params.stop)
        return req

    def add(self, req: Request) -> None:
        self.scheduler.add(req)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # -- one step, in phases so the Engine can release its lock around the forward ------------------------

    def schedule(self) -> tuple[ScheduledBatch | None, list[tuple[Request, Event]]]:
        batch = self.scheduler.schedule()
        return batch, self.scheduler.drain_finished()

    def forward_and_sample(self, batch: ScheduledBatch) -> list[int]:
        started = time.perf_counter()
        logits = self.runner.forward(batch)
        if logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        self.forward_s += time.perf_counter() - started
        sampling = [r for r, s in zip(batch.reqs, batch.samples) if s]
        return self.sampler.sample(logits, sampling)

    def process(self, batch: ScheduledBatch, tokens: list[int]) -> list[tuple[Request, Event]]:
        events: list[tuple[Request, Event]] = []
        sampling = [r for r, s in zip(batch.reqs, batch.samples) if s]
        now = time.perf_counter()
        for req, token in zip(sampling, tokens):
            self._append(req, token, now, events)
        self.scheduler.after_forward(batch)
        self.steps += 1
        return events

    def step(self) -> list[tuple[Request, Event]]:
        started = time.perf_counter()
        batch, events = self.schedule()
        if batch is not None:
            events += self.process(batch, self.forward_and_sample(batch))
        self.step_s += time.perf_counter() - started
        return events

    def abort_all(self, error: str) -> list[tuple[Request, Event]]:
        self.scheduler.abort_all(error)
        return self.scheduler.drain_finished()

    def run_until_done(self, reqs: Sequence[Request] = ()) -> list[tuple[Request, Event]]:
        """Add ``reqs`` and step until nothing is left (synchronous; for tests and benchmarks)."""
        for req in reqs:
            self.add(req)
        events: list[tuple[Request, Event]] = []
        while self.has_work:
            events += self.step()
        return events

    # -- token bookkeeping ----------------------------------------------------------------------------

    def _append(self, req: Request, token: int, now: float, events: list[tuple[Request, Event]]) -> None:
        if token == FAILED:
            self.scheduler.finish(req, FinishReason.ERROR, req.error)
            events += self.scheduler.drain_finished()
            return
        req.output_ids.append(token)
        if req.first_token_at is None:
            req.first_token_at = now
        req.last_token_at = now
        self.scheduler.counters.generated_tokens += 1
        reason: FinishReason | None = None
        error = None
        is_eos = token in self.sampler.eos_ids and not req.params.ignore_eos
        if req.matcher is not None:
            try:
                req.matcher.advance(token)
            except Exception as exc:  # a grammar bug must fail this request, not the engine
                reason, error = FinishReason.ERROR, f"grammar rejected token {token}: {exc}"
        # The EOS that ends the request is not text; anything else, special tokens included, is.
        text, stop_hit = ("", False) if is_eos else req.detok.push(token)
        events.append((req, TokenEvent(token, text)))
        if reason is not None:
            pass
        elif is_eos and req.budget_cut:
            reason = FinishReason.LENGTH  # the grammar closed an output the model was not done with
        elif is_eos or stop_hit or (req.matcher is not None and req.matcher.is_terminated()):
            reason = FinishReason.STOP
        elif len(req.output_ids) >= req.params.max_tokens or req.total_len >= req.max_total_len:
            reason = FinishReason.LENGTH
        if reason is not None:
            self.scheduler.finish(req, reason, error)
            events += self.scheduler.drain_finished()

    def set_busy(self, busy: bool) -> None:
        """The serving loop says whether it has work; background compiling runs only while it has none, and
        an idle engine picks up finished graphs (the loop calls this every ``idle_wait_s`` while idle)."""
        graphs = self.runner.decode_graphs
        if graphs is not None:
            graphs.hold_builder(busy)
            if not busy and graphs.state == "compiling":
                graphs.poll()

    @property
    def idle_wait_s(self) -> float | None:
        """How long the idle serving loop may sleep before calling ``set_busy(False)`` again (None: forever)."""
        graphs = self.runner.decode_graphs
        return POLL_S if graphs is not None and graphs.state == "compiling" else None

    @property
    def decode_compiled(self) -> str:
        """The compiled decode step: "off", "off: <why>", "compiling", "ready" or "failed: <why>"."""
        graphs = self.runner.decode_graphs
        return graphs.state if graphs is not None else self.decode_state

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()

    # -- what the Engine shows and offers (engine thread, or under the Engine's state lock) ---------------

    def snapshot(self, tree: bool = True) -> CoreSnapshot:
        """The queues, totals, pool and tree as plain data (``tree=False`` skips the node list)."""
        cache, pool, scheduler = self.cache, self.pool, self.scheduler
        return CoreSnapshot(
            running=len(scheduler.running),
            waiting=len(scheduler.waiting),
            counters=dataclasses.replace(scheduler.counters),
            steps=self.steps,
            pool_capacity=pool.capacity,
            pool_free=pool.num_free,
            kv_dtype=str(pool.shape.dtype).removeprefix("torch."),
            bytes_per_token=pool.shape.bytes_per_token,
            tree_tokens=cache.total_size,
            tree_evictable=cache.evictable_size,
            tree_protected=cache.protected_size,
            tree_version=cache.version,
            nodes=cache.snapshot() if tree else [],
        )

    def cached_path(self, ids: Sequence[int]) -> list[int]:
        """Ids of the tree nodes that ``ids`` runs through."""
        return self.cache.path_node_ids(list(ids))

    # The KV store on disk. ``run(fn, *args)`` runs pool and tree work on the engine's thread under its lock
    # (the tier does file I/O on the caller's thread in between); each answers "nothing" when the store is off.

    @property
    def kv_store_on(self) -> bool:
        return self.kv_tier is not None

    def save_kv(self, ids: Sequence[int], owner: str, run: Run) -> KVSaveResult:
        tier = self.kv_tier
        return KVSaveResult(owner, 0, 0) if tier is None else tier.save(ids, owner, run)

    def load_kv(self, ids: Sequence[int], run: Run) -> KVLoadResult:
        tier = self.kv_tier
        return KVLoadResult(0, 0) if tier is None or not ids else tier.load(ids, run)

    def kv_store_usage(self) -> KVStoreUsage | None:
        tier = self.kv_tier
        return None if tier is None else tier.store.usage()

    def delete_kv(self, owner: str) -> int:
        tier = self.kv_tier
        return 0 if tier is None else tier.store.delete_owner(owner)

    def rename_kv(self, old: str, new: str) -> bool:
        tier = self.kv_tier
        return False if tier is None else tier.store.rename_owner(old, new)
