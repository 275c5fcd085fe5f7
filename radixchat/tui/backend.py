"""How the app gets a backend, warms it with an opened session (its stored KV first), and makes a reply's sampling parameters.

The app never imports the engine (and so torch) at module level: ``load_backend``
(``radixchat.chat.loading``) runs in a thread worker and imports it there, so the window is up and
typeable while torch and the model load. Tests inject any ``BackendFactory``; a backend implements
``radixchat.chat.backend.ChatBackend``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixchat.chat.backend import ChatBackend, LoadedKV, sampling_params
from radixchat.chat.loading import Progress, load_backend

__all__ = ["BackendFactory", "Warmed", "load_backend", "make_params", "warm"]

if TYPE_CHECKING:
    from radixchat.chat.conversation import Conversation
    from radixchat.chat.session import SamplingSettings
    from radixchat.config import Settings
    from radixchat.sampling import SamplingParams

BackendFactory = Callable[["Settings", Progress], "ChatBackend"]


def warm_ids(conv: Conversation) -> list[int]:
    """The ids the next turn of ``conv`` will start with: its own if it has them all, else a rendering."""
    msgs = [m for m in conv.messages if m.role != "system"]
    if not msgs:
        return []
    if all(m.token_ids for m in msgs):
        return conv.ids
    return conv.fmt.encode(conv.fmt.render(conv.messages, add_generation_prompt=False, tools=conv.tools))


@dataclass(frozen=True, slots=True)
class Warmed:
    """How an opened conversation's history was warmed."""

    tokens: int  # the history's tokens
    loaded: LoadedKV  # what the KV store had of them (loaded from disk, or already cached)

    @property
    def prefilling(self) -> int:
        """Tokens left to prefill in the background."""
        return max(0, self.tokens - self.loaded.cached_tokens - self.loaded.loaded_tokens)

    def summary(self) -> str:
        if not self.loaded.loaded_tokens:
            return f"Prefilling {self.tokens} tokens of history in the background"
        text = f"Loaded {self.loaded.loaded_tokens} tokens of history from disk"
        return text + (f"; prefilling {self.prefilling} in the background" if self.prefilling else "")


async def warm(backend: ChatBackend, conv: Conversation) -> Warmed:
    """Warm an opened conversation's history: load what the KV store has of it (off the event loop),
    then prefill the rest in the background. ``tokens == 0``: nothing to warm."""
    ids = warm_ids(conv)
    if len(ids) <= 1:
        return Warmed(0, LoadedKV())
    loaded = await asyncio.to_thread(backend.load_kv, ids)
    backend.warm(ids)
    return Warmed(len(ids), loaded)


def make_params(settings: Settings, sampling: SamplingSettings) -> SamplingParams:
    """SamplingParams: the settings' defaults under the session's overrides."""
    return sampling_params(settings, **sampling.model_dump())
