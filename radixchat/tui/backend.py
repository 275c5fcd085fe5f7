"""How the app gets a backend, warms it with an opened session, and makes a reply's sampling parameters.

The app never imports the engine (and so torch) at module level: ``load_backend``
(``radixchat.chat.loading``) runs in a thread worker and imports it there, so the window is up and
typeable while torch and the model load. Tests inject any ``BackendFactory``; a backend implements
``radixchat.chat.backend.ChatBackend``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from radixchat.chat.backend import ChatBackend, sampling_params
from radixchat.chat.loading import Progress, load_backend

__all__ = ["BackendFactory", "load_backend", "make_params", "warm"]

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


def warm(backend: ChatBackend, conv: Conversation) -> int:
    """Prefill an opened conversation's history in the background. Returns the tokens asked for."""
    ids = warm_ids(conv)
    if len(ids) > 1:
        backend.warm(ids)
    return len(ids)


def make_params(settings: Settings, sampling: SamplingSettings) -> SamplingParams:
    """SamplingParams: the settings' defaults under the session's overrides."""
    return sampling_params(settings, **sampling.model_dump())
