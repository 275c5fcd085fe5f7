"""The radix tree, drawn from ``EngineStats.tree`` and updated incrementally.

Each refresh diffs the snapshot against what is drawn: new nodes are added, vanished or re-parented ones
(a split gives a node a new parent) are removed, and a label is rewritten only when its node's token
count, snippet, lock state, disk origin (``↓``: its KV was loaded from the KV store) or membership of
the current conversation's path changed. Nothing is rebuilt
when nothing changed, so the user's cursor and scroll position survive every tick.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

if TYPE_CHECKING:
    from radixchat.engine.stats import TreeNodeView

SNIPPET_CHARS = 26
SPECIAL = re.compile(r"(<\|[^|]*\|>|</?s>)")


def clean_snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = text.replace("\r", "").replace("\n", "⏎").replace("\t", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class CacheTree(Tree[int]):
    """``updates`` counts the label writes, adds and removes done so far (tests check it stays put)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__("radix cache", **kwargs)  # type: ignore[arg-type]
        self.show_root = True
        self.guide_depth = 2
        self._drawn: dict[int, TreeNode[int]] = {}
        self._drawn_parent: dict[int, int | None] = {}
        self._drawn_sig: dict[int, tuple] = {}
        self.updates = 0

    def on_mount(self) -> None:
        self.root.expand()

    def label_for(self, v: TreeNodeView, in_path: bool) -> Text:
        theme = self.app.current_theme
        text = Text(no_wrap=True, overflow="ellipsis")
        if v.locked:
            text.append("● ", style=theme.warning or "yellow")
        else:
            text.append("○ ", style="dim")
        text.append(f"{v.num_tokens:>4}", style="bold" if in_path else "")
        # A node whose KV came from the disk store (a saved session, or spilled KV) instead of a prefill.
        if v.from_disk:
            text.append(" ↓", style=theme.success or "green")
        text.append(" ")
        style = f"bold {theme.accent}" if in_path else ("" if v.locked else "dim")
        for i, part in enumerate(SPECIAL.split(clean_snippet(v.snippet))):
            # odd parts are special tokens (<|im_start|>, </s>, ...): markers, not content
            text.append(part, style=f"{style} dim" if i % 2 else style)
        return text

    def apply(self, nodes: Iterable[TreeNodeView], path: Iterable[int], summary: str) -> None:
        """Make the drawing match ``nodes`` (parents before children) with ``path`` highlighted."""
        views = list(nodes)
        new = {v.id: v for v in views}
        on_path = set(path)
        if str(self.root.label) != summary:
            self.root.set_label(summary)
        for nid in list(self._drawn):
            if nid not in self._drawn:
                continue  # went with an ancestor
            v = new.get(nid)
            if v is None or v.parent_id != self._drawn_parent[nid]:
                self._drop(self._drawn[nid])
        touched: set[TreeNode[int]] = set()
        for v in views:
            sig = (v.num_tokens, v.snippet, v.locked, v.id in on_path, v.from_disk)
            node = self._drawn.get(v.id)
            if node is None:
                parent = self.root if v.parent_id is None else self._drawn.get(v.parent_id)
                if parent is None:
                    continue  # its parent is beyond the snapshot's cap
                node = parent.add(self.label_for(v, sig[3]), data=v.id, expand=True, allow_expand=False)
                self._drawn[v.id], self._drawn_parent[v.id] = node, v.parent_id
                touched.add(parent)
            elif self._drawn_sig.get(v.id) == sig:
                continue
            else:
                node.set_label(self.label_for(v, sig[3]))
            self._drawn_sig[v.id] = sig
            self.updates += 1
        for node in touched:
            if node is not self.root and not node.allow_expand:
                node.allow_expand = True
                node.expand()

    def _drop(self, node: TreeNode[int]) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.data is not None:
                self._drawn.pop(n.data, None)
                self._drawn_parent.pop(n.data, None)
                self._drawn_sig.pop(n.data, None)
            stack.extend(n.children)
        parent = node.parent
        node.remove()
        if parent is not None and parent is not self.root and not parent.children:
            parent.allow_expand = False
        self.updates += 1

    @property
    def drawn_ids(self) -> set[int]:
        return set(self._drawn)
