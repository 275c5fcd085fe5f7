"""TreeNode: a node of the radix tree, and the handle a request holds (locked) on its cached prefix.

It lives apart from the caches so that ``request.py`` can name it without importing them.
"""

from __future__ import annotations

import torch


class TreeNode:
    __slots__ = ("id", "key", "value", "children", "parent", "lock_ref", "last_access", "from_disk")

    def __init__(self, node_id: int, key: list[int], value: torch.Tensor, parent: TreeNode | None) -> None:
        self.id = node_id
        self.key = key  # token ids of this edge
        self.value = value  # int64 CPU tensor of slots, same length as key
        self.children: dict[int, TreeNode] = {}
        self.parent = parent  # None for the root (and for a leaf once it is evicted)
        self.lock_ref = 0
        self.last_access = 0
        self.from_disk = False  # its KV was loaded from the disk store, not computed

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock_ref={self.lock_ref})"
