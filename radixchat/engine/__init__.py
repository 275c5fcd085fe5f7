"""The inference engine: radix KV cache, continuous batching, streaming. Knows tokens, not chat."""

from radixchat.engine.core import EngineConfig, EngineCore
from radixchat.engine.engine import Completion, Engine, RequestHandle, engine_config
from radixchat.engine.kvstore import KVLoadResult, KVSaveResult, KVStoreUsage, OwnerUsage
from radixchat.engine.loader import LoadedModel, load_model
from radixchat.engine.request import (
    Event,
    FinishEvent,
    FinishReason,
    SamplingParams,
    TokenEvent,
    TokenMatcher,
    Usage,
)
from radixchat.engine.stats import EngineStats, TreeNodeView

__all__ = [
    "Completion",
    "Engine",
    "EngineConfig",
    "EngineCore",
    "EngineStats",
    "Event",
    "FinishEvent",
    "FinishReason",
    "KVLoadResult",
    "KVSaveResult",
    "KVStoreUsage",
    "LoadedModel",
    "OwnerUsage",
    "RequestHandle",
    "SamplingParams",
    "TokenEvent",
    "TokenMatcher",
    "TreeNodeView",
    "Usage",
    "engine_config",
    "load_model",
]
