"""Getting a backend for ``Settings``: shared by the chat app and batch mode.

Nothing heavy is imported at module level: the engine (and so torch) or the HTTP client is imported
when ``load_backend`` runs, which the app does in a thread worker so its window is up meanwhile.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixchat.chat.backend import ChatBackend
    from radixchat.config import Settings

Progress = Callable[[str], None]

_settle_heap = False  # see settled_heap
_settle_grammar = True


@contextmanager
def settled_heap(grammar: bool = True) -> Iterator[None]:
    """For a process that runs one front end (the CLI): a local backend loaded within this block then takes
    what is on the heap (torch, transformers, the model) out of Python's cyclic garbage collector with
    ``gc.freeze()``. A full collection over that heap holds the GIL for long, and in the chat app one came
    often enough to stall the engine's decoding for a whole reply. Objects are given back to the collector
    when the block ends (before the interpreter's own teardown). ``grammar``: import the grammar engine
    first, to freeze it too (a one-shot plain reply never uses it, and its import is ~0.3 s)."""
    global _settle_heap, _settle_grammar
    _settle_heap, _settle_grammar = True, grammar
    try:
        yield
    finally:
        _settle_heap, _settle_grammar = False, True
        gc.unfreeze()


def load_backend(settings: Settings, progress: Progress = lambda _: None) -> ChatBackend:
    """The backend ``settings`` name (blocking: run it in a thread): the in-process engine with its model
    loaded, or an OpenAI-compatible server (``backend = URL``) with its model checked. Raises
    ModelLoadError / BackendUnavailableError."""
    if settings.backend != "local":
        from radixchat.chat.remote import load_remote_backend

        return load_remote_backend(settings, progress)
    progress("importing the engine")
    from radixchat.chat.local import LocalBackend

    backend = LocalBackend.from_settings(settings, progress)
    if _settle_heap:  # no gc.collect() first: after a load it finds next to nothing, at a full pass's cost
        # the grammar engine's modules (Lark, jsonschema) too, or JSON and tool modes import them later,
        # into the heap each full collection walks, for the rest of the process
        if _settle_grammar:
            import radixchat.grammar  # noqa: F401

        gc.freeze()
    return backend


def release_memory() -> None:
    """Collect what a closed backend held once its last reference is gone (a model switch: the old
    model's weights and KV pool). Under ``settled_heap`` the heap was frozen after each load, the old
    model with it: it is thawed for this collection and frozen again after it."""
    if _settle_heap:
        gc.unfreeze()
    gc.collect()
    if _settle_heap:
        gc.freeze()
