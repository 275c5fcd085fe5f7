"""The in-process engine's configuration, from the app's ``Settings``.

The engine takes its own typed configs (``ModelConfig``, ``EngineConfig``) and knows nothing of the app's
setting names; this module, part of the local backend, is the one place that maps one onto the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from radixchat.engine import Engine, EngineConfig, ModelConfig

if TYPE_CHECKING:
    from radixchat.config import Settings


def model_config(settings: Settings) -> ModelConfig:
    return ModelConfig(
        name=settings.model,
        cache_dir=settings.cache_dir,
        device=settings.device,
        dtype=settings.dtype,
        weights=settings.weights,
    )


def engine_config(settings: Settings) -> EngineConfig:
    return EngineConfig(
        kv_pool_tokens=settings.kv_pool_tokens,
        kv_memory_fraction=settings.kv_memory_fraction,
        max_running_requests=settings.max_running_requests,
        chunked_prefill_size=settings.chunked_prefill_size,
        schedule_policy=settings.schedule_policy,
        radix_cache=settings.radix_cache,
        debug=settings.debug,
        compile=settings.compile,
        cache_dir=settings.cache_dir,
        kv_dtype=settings.kv_dtype,
        code_prefetch=settings.code_prefetch,
        deterministic=settings.deterministic,
        kv_store_dir=settings.cache_dir / "kv" if settings.kv_store else None,
        kv_store_bytes=int(settings.kv_store_gib * 2**30),
        kv_spill=settings.kv_spill,
    )


def engine_from_settings(settings: Settings, progress: Callable[[str], None] | None = None) -> Engine:
    """Load the model ``settings`` names and build its engine (blocking; ``progress`` is called from the
    engine's thread)."""
    return Engine.from_config(model_config(settings), engine_config(settings), progress=progress)
