"""The KV store: the fourth memory level, on disk below the radix tree.

``blocks`` is the file format, ``store`` the directory (index, owners, budget) over ``files`` (atomic
writes, owner records, scans), ``fingerprint`` the model identity that keys it, and ``tier`` moves KV
between the pool + tree and the store.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from radixchat.engine.kvstore.blocks import Expect
from radixchat.engine.kvstore.files import describe_os_error
from radixchat.engine.kvstore.fingerprint import model_fingerprint
from radixchat.engine.kvstore.store import KVStore, KVStoreUsage, OwnerUsage
from radixchat.engine.kvstore.tier import KVLoadResult, KVSaveResult, KVTier

log = logging.getLogger(__name__)


def open_tier(
    lm: Any, pool: Any, cache: Any, counters: Any, *, root: Path, budget_bytes: int, spill: bool
) -> KVTier | None:
    """The KV tier for this model and pool, or None (with a logged warning) if its directory is unusable."""
    expect = Expect(
        model_fingerprint(lm),
        str(pool.shape.dtype).removeprefix("torch."),
        pool.shape.num_layers,
        pool.shape.num_kv_heads,
        pool.shape.head_dim,
    )
    try:
        store = KVStore(root, expect, budget_bytes)
    except OSError as exc:
        log.warning("KV store off: cannot use %s: %s", root, describe_os_error(exc))
        return None
    return KVTier(store, pool, cache, counters, spill)


__all__ = ["KVLoadResult", "KVSaveResult", "KVStore", "KVStoreUsage", "KVTier", "OwnerUsage", "open_tier"]
