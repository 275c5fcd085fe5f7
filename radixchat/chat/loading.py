"""Getting a backend for ``Settings``: shared by the chat app and batch mode.

Nothing heavy is imported at module level: the engine (and so torch) or the HTTP client is imported
when ``load_backend`` runs, which the app does in a thread worker so its window is up meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixchat.chat.backend import ChatBackend
    from radixchat.config import Settings

Progress = Callable[[str], None]


def load_backend(settings: Settings, progress: Progress = lambda _: None) -> ChatBackend:
    """The backend ``settings`` name (blocking: run it in a thread): the in-process engine with its model
    loaded, or an OpenAI-compatible server (``backend = URL``) with its model checked. Raises
    ModelLoadError / BackendUnavailableError."""
    if settings.backend != "local":
        from radixchat.chat.remote import load_remote_backend

        return load_remote_backend(settings, progress)
    progress("importing the engine")
    from radixchat.chat.local import LocalBackend

    return LocalBackend.from_settings(settings, progress)
