"""The KV store: the fourth memory level, on disk below the radix tree.

``blocks`` is the file format, ``store`` the directory (index, owners, budget) over ``files`` (atomic
writes, owner records, scans), ``fingerprint`` the model identity that keys it, and ``tier`` moves KV
between the pool + tree and the store, where ``spill`` writes what the tree evicts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from radixchat.engine.kv_pool import KVShape
from radixchat.engine.kvstore.blocks import Expect
from radixchat.engine.kvstore.files import describe_os_error
from radixchat.engine.kvstore.fingerprint import model_fingerprint
from radixchat.engine.kvstore.spill import Spiller
from radixchat.engine.kvstore.store import KVStore, KVStoreUsage, OwnerUsage
from radixchat.engine.kvstore.tier import KVLoadResult, KVSaveResult, KVTier
from radixchat.engine.loader import LoadedModel

log = logging.getLogger(__name__)


def open_store(lm: LoadedModel, shape: KVShape, root: Path, budget_bytes: int) -> KVStore | None:
    """The store for this model's KV in ``shape`` under ``root``, or None (with a logged warning) if the
    directory is unusable."""
    expect = Expect(
        model_fingerprint(lm),
        str(shape.dtype).removeprefix("torch."),
        shape.num_layers,
        shape.num_kv_heads,
        shape.head_dim,
    )
    try:
        return KVStore(root, expect, budget_bytes)
    except OSError as exc:
        log.warning("KV store off: cannot use %s: %s", root, describe_os_error(exc))
        return None


__all__ = [
    "KVLoadResult",
    "KVSaveResult",
    "KVStore",
    "KVStoreUsage",
    "KVTier",
    "OwnerUsage",
    "Spiller",
    "open_store",
]
