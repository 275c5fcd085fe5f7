"""The KV pool: token-granular K/V storage shared by every request and the radix tree.

Per layer, one K and one V tensor of shape ``[num_slots, num_kv_heads, head_dim]``. A slot holds one
token's K/V for every layer. Slot 0 is a dummy: padded gathers read it and nothing ever owns it, so
``capacity == num_slots - 1``.

Ownership of a slot (the integrity invariant, checked by ``EngineCore.check_integrity``):
exactly one of {free list, radix tree, one running request's private range}.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        elem = torch.finfo(self.dtype).bits // 8
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


class KVPool:
    """K/V tensors plus a free-slot allocator.

    ``alloc`` and ``free`` deal in Python lists of ints; callers turn them into tensors once per step.
    Freeing a slot twice, or freeing slot 0, is a bug and raises.
    """

    def __init__(self, shape: KVShape, capacity: int, device: torch.device) -> None:
        if capacity < 1:
            raise ValueError("KV pool needs at least one slot")
        self.shape = shape
        self.capacity = capacity
        self.device = device
        size = (capacity + 1, shape.num_kv_heads, shape.head_dim)
        # Uninitialised (allocating gigabytes of zeros takes seconds); only the dummy slot must be finite,
        # because padded gathers read it and a masked NaN still poisons attention.
        self.k = [torch.empty(size, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        self.v = [torch.empty(size, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        for t in (*self.k, *self.v):
            t[0].zero_()
        # Stack order: pop from the end, so low slots are handed out first (nicer to read in tests).
        self._free: list[int] = list(range(capacity, 0, -1))
        self._is_free = bytearray(capacity + 1)
        for slot in self._free:
            self._is_free[slot] = 1

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def nbytes(self) -> int:
        return (self.capacity + 1) * self.shape.bytes_per_token

    def alloc(self, n: int) -> list[int] | None:
        """Take ``n`` free slots, or return None (and take nothing) if fewer are free."""
        if n > len(self._free):
            return None
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        for slot in out:
            self._is_free[slot] = 0
        return out

    def free(self, slots: list[int] | torch.Tensor) -> None:
        if isinstance(slots, torch.Tensor):
            slots = slots.tolist()
        for slot in slots:
            if slot <= 0 or self._is_free[slot]:
                raise RuntimeError(f"KV slot {slot} freed twice (or dummy slot)")
            self._is_free[slot] = 1
        self._free.extend(slots)

    def free_set(self) -> set[int]:
        return set(self._free)


class ReqToTokenTable:
    """Level 2 of the memory: one row per running request, holding the slot of each of its positions.

    Rows live on the model's device so a decode batch gathers its ``[B, Lmax]`` slot matrix with one
    indexing op. Cells past a request's ``kv_len`` hold stale but valid slot numbers (masked out).
    """

    def __init__(self, max_rows: int, max_len: int, device: torch.device) -> None:
        self.max_len = max_len
        self.table = torch.zeros((max_rows, max_len), dtype=torch.int64, device=device)
        self._free_rows = list(range(max_rows - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int:
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: list[int] | torch.Tensor) -> None:
        if isinstance(slots, list):
            slots = torch.tensor(slots, dtype=torch.int64)
        self.table[row, start : start + slots.numel()] = slots.to(self.table.device, non_blocking=True)

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        """Slots of positions [start, end) as an int64 CPU tensor."""
        return self.table[row, start:end].cpu()
