"""EngineStats: everything a front end may show, as plain data (no tensors, no live objects); and the
engine's running totals (``SchedulerCounters``), which the scheduler and the KV tier add to."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TreeNodeView:
    id: int
    parent_id: int | None  # None: a child of the root
    num_tokens: int
    snippet: str  # the start of the node's text
    locked: bool  # in use by a running request (not evictable)
    last_access: int
    from_disk: bool = False  # its KV was loaded from the disk store (not computed in this run)


@dataclass(frozen=True, slots=True)
class LastRequest:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None
    decode_tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class EngineStats:
    model: str
    device: str
    dtype: str
    running: int
    waiting: int
    # totals since start
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int  # tokens run through the model (prefill and decode)
    generated_tokens: int
    retractions: int
    evicted_tokens: int
    steps: int
    # KV pool
    pool_capacity: int
    pool_free: int
    tree_tokens: int
    tree_evictable: int
    tree_protected: int
    bytes_per_token: int
    # memory
    device_allocated: int | None  # CUDA bytes allocated (None on CPU)
    device_reserved: int | None
    process_rss: int
    # the radix tree, parents before children
    tree_version: int
    tree: tuple[TreeNodeView, ...] = field(default=())
    last_request: LastRequest | None = None
    # the KV store on disk (totals since start)
    kv_loaded_tokens: int = 0  # loaded into the tree (a request using them counts them as cached)
    kv_spilled_tokens: int = 0  # written to the store as the pool evicted them
    # how the linear layers store their weights, and which kernel serves which rows:
    # "int4 (layers int4≤16 bfloat16, head float16)"; "float32" is the exact path
    weights: str = "float32"
    decode_compiled: str = "off"  # the compiled decode step: "off", "off: <why>" (no memory for its builder), "compiling", "ready" or "failed: <why>"
    kv_dtype: str = (
        "float32"  # what the KV pool holds K/V in ("float32" with float32 weights: the exact path)
    )
    # how decode attention reads the pool: "paged" (in place, the native kernel) or "gathered" (a copy, SDPA)
    decode_attention: str = "gathered"
    deterministic: bool = False  # batch-invariant inference (a reply depends on its prompt alone)

    @property
    def weights_format(self) -> str:
        return self.weights.split(" ", 1)[0]

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def pool_used(self) -> int:
        return self.pool_capacity - self.pool_free

    @property
    def pool_bytes(self) -> int:
        return (self.pool_capacity + 1) * self.bytes_per_token


@dataclass(slots=True)
class SchedulerCounters:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    computed_tokens: int = 0  # tokens fed through the model (prefill and decode)
    generated_tokens: int = 0
    retractions: int = 0
    evicted_tokens: int = 0
    loaded_tokens: int = 0  # KV loaded from the disk store into the tree
    spilled_tokens: int = 0  # KV written to the disk store as the tree evicted it
