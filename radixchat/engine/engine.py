"""Engine: the public async API over EngineCore.

One dedicated thread does all of the engine's torch work: it loads the model, builds the pool, runs
every step, and runs jobs handed to it with ``call`` (grammar compilation) between steps. torch
releases the GIL, so the asyncio loop — and a Textual UI on it — stays responsive. The thread owns all
engine state; other threads only enqueue requests and jobs, flag cancellations, and read ``stats()``
under a lock that the thread drops while the model computes. Events go back to each request's event loop
with ``call_soon_threadsafe``, one call per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil
import torch

from radixchat.engine.core import EngineConfig, EngineCore
from radixchat.engine.kvstore import KVLoadResult, KVSaveResult, KVStoreUsage
from radixchat.engine.loader import LoadedModel, ModelConfig, load_model
from radixchat.engine.request import (
    Event,
    FinishEvent,
    FinishReason,
    Request,
    SamplingParams,
    TokenEvent,
    TokenMatcher,
    Usage,
)
from radixchat.engine.stats import EngineStats, LastRequest, TreeNodeView
from radixchat.errors import EngineStoppedError

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class Completion:
    """A finished request, collected from its events."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    usage: Usage
    ttft_s: float | None
    decode_tokens_per_s: float | None
    error: str | None = None


@dataclass(eq=False)
class RequestHandle:
    """Returned by ``Engine.submit``: iterate it for events, ``cancel()`` it, or ``await result()``."""

    request: Request
    _engine: Engine
    _loop: asyncio.AbstractEventLoop
    _queue: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    _done: bool = False

    @property
    def rid(self) -> int:
        return self.request.rid

    def cancel(self) -> None:
        """Stop at the next step; what was generated is kept (and cached)."""
        self.request.cancelled = True
        self._engine._wake()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while not self._done:
            ev = await self._queue.get()
            if isinstance(ev, FinishEvent):
                self._done = True
            yield ev

    async def result(self) -> Completion:
        text: list[str] = []
        ids: list[int] = []
        async for ev in self:
            text.append(ev.text)
            if isinstance(ev, TokenEvent):
                ids.append(ev.token_id)
            else:
                return Completion(
                    "".join(text), ids, ev.reason, ev.usage, ev.ttft_s, ev.decode_tokens_per_s, ev.error
                )
        raise EngineStoppedError("request ended without a finish event")


class Engine:
    """Load a model, then ``await start()``, ``submit()`` requests, ``await stop()``.

    Every torch operation of the engine (loading, building the pool, each step, grammar compilation via
    ``call``) runs on the engine's one thread. That is for speed, not tidiness: with PyTorch's OpenMP
    runtime, each thread that runs parallel kernels gets its own pool of worker threads, and once the
    process has more of those than cores, libgomp stops spinning between kernels, and every small
    decode-step kernel then pays for waking its workers.
    """

    def __init__(
        self, loaded: LoadedModel | Callable[[], LoadedModel], config: EngineConfig | None = None
    ) -> None:
        self._cv = threading.Condition()
        self._state_lock = threading.Lock()  # held by the worker except during forward + sampling
        self._jobs: list[tuple[Future, Callable[[], Any]]] = []
        self._inbox: list[tuple[Request, RequestHandle]] = []
        self._handles: dict[int, RequestHandle] = {}
        self._serving = False
        self._stopping = False
        self._closed = False
        self._last: LastRequest | None = None
        self._snippets: dict[tuple[int, ...], str] = {}
        self.core: EngineCore | None = None  # type: ignore[assignment]
        self._thread = threading.Thread(target=self._worker, name="radixchat-engine", daemon=True)
        self._thread.start()
        try:
            self.loaded: LoadedModel = loaded if isinstance(loaded, LoadedModel) else self.call(loaded)
            self.core = self.call(EngineCore, self.loaded, config)
        except BaseException:
            self._shutdown()
            raise

    @classmethod
    def from_config(
        cls, model: ModelConfig, config: EngineConfig, progress: Callable[[str], None] | None = None
    ) -> Engine:
        """Load ``model`` on the engine's thread and build an engine over it (``config.deterministic`` also
        picks the model's deterministic weights plan). ``progress`` is called from the engine's thread."""
        return cls(
            functools.partial(
                load_model,
                model.name,
                device=model.device,
                dtype=model.dtype,
                weights=model.weights,
                cache_dir=model.cache_dir,
                progress=progress,
                deterministic=config.deterministic,
            ),
            config,
        )

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the engine's thread (between steps) and return its result; blocks the caller."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise EngineStoppedError("the engine is stopped")
            self._jobs.append((future, functools.partial(fn, *args, **kwargs)))
            self._cv.notify()
        return future.result()

    # -- properties -----------------------------------------------------------------------------------

    @property
    def tokenizer(self):  # noqa: ANN201 - a transformers tokenizer
        return self.loaded.tokenizer

    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.loaded.eos_ids

    @property
    def context_tokens(self) -> int:
        """The most tokens one request may hold, prompt and output together (the model's context, or
        the KV pool if that is smaller)."""
        return self.core.max_total_len

    @property
    def running(self) -> bool:
        return self._serving and self._thread.is_alive()

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise EngineStoppedError("the engine was stopped; build a new one")
        self._serving = True

    async def stop(self) -> None:
        """Cancel everything in flight, let the worker finish its step, and end its thread."""
        self._serving = False
        for handle in list(self._handles.values()):
            handle.request.cancelled = True
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

    def _shutdown(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- requests -------------------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        grammar: TokenMatcher | None = None,
        *,
        _warmup: bool = False,
    ) -> RequestHandle:
        """Queue a request; must be called on a running event loop. Raises RequestError subclasses."""
        if not self.running or self._stopping:
            raise EngineStoppedError("the engine is not running")
        loop = asyncio.get_running_loop()
        req = self.core.make_request(prompt_ids, params, grammar)
        req.warmup = _warmup
        handle = RequestHandle(req, self, loop)
        with self._cv:
            self._inbox.append((req, handle))
            self._cv.notify()
        return handle

    def prefill(self, prompt_ids: Sequence[int]) -> RequestHandle:
        """Compute and cache the KV of ``prompt_ids`` in the background (not counted in hit rates)."""
        return self.submit(prompt_ids, SamplingParams(max_tokens=1), _warmup=True)

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams | None = None,
        grammar: TokenMatcher | None = None,
    ) -> Completion:
        return await self.submit(prompt_ids, params, grammar).result()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    # -- the worker thread ----------------------------------------------------------------------------

    def _worker(self) -> None:
        torch.set_grad_enabled(False)
        try:
            self._serve()
        finally:
            with self._cv:
                self._closed = True
                jobs, self._jobs = self._jobs, []
            for future, _ in jobs:
                future.set_exception(EngineStoppedError("the engine is stopped"))

    def _serve(self) -> None:
        while True:
            core = self.core
            with self._cv:
                while not (
                    self._jobs or self._inbox or self._stopping or (core is not None and core.has_work)
                ):
                    if core is not None:
                        core.set_busy(False)
                    if core is not None and core.cfg.debug:
                        with self._state_lock:
                            core.check_integrity()
                    self._cv.wait(core.idle_wait_s if core is not None else None)
                jobs, self._jobs = self._jobs, []
                inbox, self._inbox = self._inbox, []
                stopping = self._stopping
            for future, job in jobs:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(job())
                    except BaseException as exc:  # handed to the caller of call()
                        future.set_exception(exc)
            core = self.core
            if core is None:
                if stopping:
                    return
                continue
            for req, handle in inbox:
                self._handles[req.rid] = handle
                if stopping:
                    req.cancelled = True
                core.add(req)
            if stopping and not core.has_work:
                core.set_busy(False)
                return
            if not core.has_work:
                continue
            core.set_busy(True)
            started = time.perf_counter()
            try:
                with self._state_lock:
                    batch, events = core.schedule()
                if batch is not None:
                    tokens = core.forward_and_sample(batch)
                    with self._state_lock:
                        events += core.process(batch, tokens)
            except Exception as exc:  # a bug or device error: fail what is in flight, keep serving
                log.exception("engine step failed")
                with self._state_lock:
                    events = core.abort_all(f"engine error: {type(exc).__name__}: {exc}")
            self._deliver(events)
            core.step_s += time.perf_counter() - started

    def _deliver(self, events: list[tuple[Request, Event]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, Event]]] = {}
        for req, ev in events:
            handle = self._handles.get(req.rid)
            if handle is None:
                continue
            if isinstance(ev, FinishEvent):
                del self._handles[req.rid]
            if isinstance(ev, FinishEvent) and not req.warmup:
                self._last = LastRequest(
                    ev.usage.prompt_tokens,
                    ev.usage.cached_tokens,
                    ev.usage.completion_tokens,
                    ev.ttft_s,
                    ev.decode_tokens_per_s,
                )
            by_loop.setdefault(handle._loop, []).append((handle, ev))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening any more
                loop.call_soon_threadsafe(_put_all, items)

    # -- introspection --------------------------------------------------------------------------------

    def stats(self, tree: bool = True) -> EngineStats:
        """A consistent snapshot; safe from any thread (waits at most for one scheduling phase)."""
        core = self.core
        with self._state_lock:
            snap = core.snapshot(tree)
            waiting = snap.waiting + len(self._inbox)
        c = snap.counters
        views = tuple(
            TreeNodeView(
                n.id,
                n.parent_id,
                n.num_tokens,
                self._snippet(n.head_ids),
                n.locked,
                n.last_access,
                n.from_disk,
            )
            for n in snap.nodes
        )
        dev = self.loaded.device
        allocated = reserved = None
        if dev.type == "cuda":
            allocated, reserved = torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev)
        return EngineStats(
            model=self.loaded.name,
            device=str(dev),
            dtype=str(self.loaded.dtype).removeprefix("torch."),
            weights=self.loaded.weights.name,
            decode_compiled=core.decode_compiled,
            kv_dtype=snap.kv_dtype,
            decode_attention="paged" if core.paged_decode else "gathered",
            deterministic=core.cfg.deterministic,
            bytes_per_token=snap.bytes_per_token,
            device_allocated=allocated,
            device_reserved=reserved,
            process_rss=psutil.Process().memory_info().rss,
            running=snap.running,
            waiting=waiting,
            prompt_tokens=c.prompt_tokens,
            cached_tokens=c.cached_tokens,
            computed_tokens=c.computed_tokens,
            generated_tokens=c.generated_tokens,
            retractions=c.retractions,
            evicted_tokens=c.evicted_tokens,
            kv_loaded_tokens=c.loaded_tokens,
            kv_spilled_tokens=c.spilled_tokens,
            steps=snap.steps,
            pool_capacity=snap.pool_capacity,
            pool_free=snap.pool_free,
            tree_tokens=snap.tree_tokens,
            tree_evictable=snap.tree_evictable,
            tree_protected=snap.tree_protected,
            tree_version=snap.tree_version,
            tree=views,
            last_request=self._last,
        )

    # -- the KV store on disk -------------------------------------------------------------------------
    # These block the caller (from async code: ``await asyncio.to_thread(engine.save_kv, ids, name)``).
    # Pool and tree work runs on the engine's thread between steps; file I/O runs on the caller's.

    @property
    def kv_store_on(self) -> bool:
        """Whether the KV store is in use (the setting is on and its directory was usable)."""
        return self.core.kv_store_on

    def save_kv(self, ids: Sequence[int], owner: str) -> KVSaveResult:
        """Store on disk, for ``owner`` (e.g. a session file's path), the KV of the longest prefix of ``ids`` that is
        in the pool or already stored; it replaces what ``owner`` had saved before.

        Best effort: never raises for disk errors (a full disk, an unwritable cache directory) or a
        stopped engine; ``notice`` then says in one line what was not saved. Save the owner's own
        file (a session) first: this is a cache of it. ``tokens == 0`` when the store is off."""
        try:
            return self.core.save_kv(ids, owner, self._run_locked)
        except EngineStoppedError:
            return KVSaveResult(owner, 0, 0, "KV not saved: the engine is stopped")

    def load_kv(self, ids: Sequence[int]) -> KVLoadResult:
        """Load the longest stored continuation of ``ids`` from disk into the cache (e.g. when a session
        is opened), so the next request over ``ids`` prefills only what follows. A damaged or foreign
        file is skipped with a notice and its tokens are computed as usual. Requests do this by
        themselves on admission; calling it early takes the disk read off the first reply's TTFT."""
        try:
            return self.core.load_kv(ids, self._run_locked)
        except EngineStoppedError:
            return KVLoadResult(0, 0)

    def kv_store_usage(self) -> KVStoreUsage | None:
        """Which owners have KV on disk for this model and how many bytes each takes (None: store off).
        Reads files only; safe from any thread."""
        return self.core.kv_store_usage()

    def delete_kv(self, owner: str) -> int:
        """Delete ``owner``'s KV for every model (blocks other owners share stay). Returns bytes freed."""
        return self.core.delete_kv(owner)

    def rename_kv(self, old: str, new: str) -> bool:
        """Give ``old``'s stored KV to ``new`` (a renamed session). Returns whether there was any."""
        return self.core.rename_kv(old, new)

    def _run_locked(self, fn: Callable[..., T], *args: Any) -> T:
        def job() -> T:
            with self._state_lock:
                return fn(*args)

        return self.call(job)

    def cached_path(self, ids: Sequence[int]) -> list[int]:
        """Ids of the tree nodes that ``ids`` runs through (to highlight a conversation in a UI)."""
        with self._state_lock:
            return self.core.cached_path(ids)

    def _snippet(self, head: tuple[int, ...]) -> str:
        text = self._snippets.get(head)
        if text is None:
            tok = self.loaded.tokenizer
            text = (
                tok.decode(list(head), skip_special_tokens=False)
                if tok is not None
                else " ".join(map(str, head))
            )
            if len(self._snippets) > 20000:
                self._snippets.clear()
            self._snippets[head] = text
        return text


def _put_all(items: list[tuple[RequestHandle, Event]]) -> None:
    for handle, ev in items:
        handle._queue.put_nowait(ev)


__all__ = ["Completion", "Engine", "RequestHandle"]
