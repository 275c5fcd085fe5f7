"""The inference engine: radix KV cache, continuous batching, streaming. Knows tokens, not chat.

Exported here is what a user of the engine needs: ``Engine`` (built from a loaded model, or from a
``ModelConfig`` with ``Engine.from_config``, and an ``EngineConfig``), ``SamplingParams``, the request handle and its events, ``TokenMatcher`` (what a
grammar gives a request), and the stats. Its parts (``EngineCore``, the pool, the tree, the scheduler,
the loader) are imported from their own modules by the tests and benchmarks that take them apart; so
are the KV store's result types (``radixchat.engine.kvstore``) that ``Engine.save_kv``/``load_kv`` return.
"""

import radixchat.engine._mkl  # noqa: F401  (first: initialises MKL's vector math on one thread)
from radixchat.engine.core import EngineConfig
from radixchat.engine.engine import Completion, Engine, RequestHandle
from radixchat.engine.loader import ModelConfig
from radixchat.engine.request import Event, FinishEvent, FinishReason, TokenEvent, TokenMatcher, Usage
from radixchat.engine.stats import EngineStats, LastRequest, TreeNodeView
from radixchat.sampling import SamplingParams

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "EngineStats",
    "Event",
    "FinishEvent",
    "FinishReason",
    "LastRequest",
    "ModelConfig",
    "RequestHandle",
    "SamplingParams",
    "TokenEvent",
    "TokenMatcher",
    "TreeNodeView",
    "Usage",
]
