"""EngineCore: the synchronous heart of the engine — schedule, forward, sample, update.

It owns the KV pool, the radix tree, the request table, the scheduler, the model runner and the
sampler, and is driven by exactly one thread (``Engine``'s worker, or a test calling ``step()``).
"""

from __future__ import annotations

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
from radixchat.engine.kvstore import open_tier
from radixchat.engine.loader import LoadedModel
from radixchat.engine.model_runner import ModelRunner
from radixchat.engine.radix_cache import RadixCache
from radixchat.engine.request import (
    Event,
    FinishEvent,
    FinishReason,
    Request,
    SamplingParams,
    TokenEvent,
    TokenMatcher,
    validate_prompt,
)
from radixchat.engine.sampler import FAILED, Sampler
from radixchat.engine.scheduler import Scheduler
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
    # Batch invariance: every token through one code path (eager; decode and prefill through the same
    # attention kernel). The model's weights plan must be deterministic too (load_model(deterministic=True)).
    deterministic: bool = False


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
        kv_dtype = resolve_kv_dtype(
            cfg.kv_dtype,
            lm.dtype,
            lm.device,
            (lm.model.config.num_attention_heads, lm.num_kv_heads, lm.head_dim),
            cfg.cache_dir,
        )
        shape = KVShape(lm.num_layers, lm.num_kv_heads, lm.head_dim, kv_dtype)
        self.pool = KVPool(shape, pool_capacity(lm, cfg, shape), lm.device)
        self.max_total_len = min(lm.max_context, self.pool.capacity)
        self.table = ReqToTokenTable(cfg.max_running_requests, self.max_total_len, lm.device)
        self.cache = RadixCache(self.pool)
        self.scheduler = Scheduler(
            self.pool,
            self.table,
            self.cache,
            max_running=cfg.max_running_requests,
            chunk_size=cfg.chunked_prefill_size,
            policy=cfg.schedule_policy,
            cache_enabled=cfg.radix_cache,
        )
        self.kv_tier = None
        if cfg.kv_store_dir is not None and cfg.radix_cache:
            self.kv_tier = open_tier(
                lm,
                self.pool,
                self.cache,
                self.scheduler.counters,
                root=cfg.kv_store_dir,
                budget_bytes=cfg.kv_store_bytes,
                spill=cfg.kv_spill,
            )
        self.scheduler.kv_tier = self.kv_tier
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
        self.runner = ModelRunner(
            lm.model,
            self.pool,
            self.table,
            paged=self.paged_decode,
            paged_extend=paged_extend,
            unified=cfg.deterministic,
        )
        self.decode_state = "off"
        if wants_compile(cfg.compile, lm, cfg.deterministic):
            why = compile_unavailable(lm.model, lm.device) or (
                "no cache directory" if cfg.cache_dir is None else None
            )
            if why is None:
                assert cfg.cache_dir is not None
                spec = build_spec(lm, kv_dtype, self.paged_decode, cfg.max_running_requests)
                self.runner.decode_graphs = DecodeGraphs(lm.model, spec, cfg.cache_dir)
            else:
                self.decode_state = f"failed: {why}"
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
        return batch, [(r, self._finish_event(r)) for r in self.scheduler.drain_finished()]

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
        return [(r, self._finish_event(r)) for r in self.scheduler.abort_all(error)]

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
            events.append((req, self._finish_event(req)))
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
            events.append((req, self._finish_event(req)))

    def _finish_event(self, req: Request) -> FinishEvent:
        ttft, tps = req.timings()
        tail = req.detok.flush() if req.detok is not None else ""
        assert req.finish_reason is not None
        return FinishEvent(req.finish_reason, tail, req.usage(), ttft, tps, req.error)

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
        """The compiled decode step: "off", "compiling", "ready" or "failed: <why>"."""
        graphs = self.runner.decode_graphs
        return graphs.state if graphs is not None else self.decode_state

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
