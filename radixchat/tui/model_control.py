"""The chat screen's model switch (F7): pick a model, load it while the current one stays on screen, and
continue the conversation on it.

``ModelControl`` opens the picker (``screens/models.py``) over what ``chat/model_catalog.py`` finds (with
``--backend URL``, the server's models) and runs ``ChatCore.switch_model`` in a worker. While the new
model loads, the status line says so, the transcript and prompt stay usable, and a message sent meanwhile
waits for the new model (as one sent during the first load does). A switch is refused while a reply is
being generated; a model that fails to load is one line, and the old model and conversation stay. After
a switch the transcript marks where it happened, the session is saved recording the new model, and the
model goes into the recent list.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from radixchat.chat.model_catalog import local_catalog, remember, served_catalog
from radixchat.errors import RadixchatError
from radixchat.tui.host import ChatHost
from radixchat.tui.widgets.transcript import switch_note

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from textual.worker import Worker

    from radixchat.chat.backend import ChatBackend
    from radixchat.chat.model_catalog import ModelEntry
    from radixchat.tui.backend import BackendFactory
    from radixchat.tui.chat_core import ChatCore
    from radixchat.tui.in_flight import ReplyInFlight
    from radixchat.tui.session_control import SessionControl
    from radixchat.tui.turn_control import TurnControl
    from radixchat.tui.widgets.welcome import Welcome


class ModelHost(ChatHost, Protocol):
    """What the model switch uses of the chat screen."""

    @property
    def in_flight(self) -> ReplyInFlight | None: ...
    def welcome(self) -> Welcome: ...
    def refresh_panels(self) -> None: ...
    def run_worker(
        self, work: Coroutine[Any, Any, Any], *, group: str = "default", exit_on_error: bool = True
    ) -> Worker[Any]: ...


def short_name(spec: str) -> str:
    """How a model being loaded is named before it has loaded: a path's last part, else the spec."""
    return Path(spec).name or spec


class ModelControl:
    def __init__(
        self,
        core: ChatCore,
        host: ModelHost,
        sessions: SessionControl,
        turns: TurnControl,
        load: BackendFactory,
    ) -> None:
        self.core = core
        self.host = host
        self.sessions = sessions
        self.turns = turns
        self.load = load  # the app's backend factory (run in a thread)

    def pick(self) -> None:
        """The model picker; the model chosen there is switched to."""
        host, core = self.host, self.core
        backend = core.backend
        if backend is None or core.switching is not None:  # the first load, or a switch, is under way
            host.notify(f"Not now: {core.loading or core.load_status}", title="Model", severity="warning")
            return
        settings = core.settings
        if backend.base_url is not None:

            async def catalog() -> list[ModelEntry]:
                return served_catalog(await backend.list_models())

            where = f"models served by {backend.base_url}"
        else:

            async def catalog() -> list[ModelEntry]:
                return await asyncio.to_thread(local_catalog, settings.models_dir, settings.cache_dir)

            where = f"models_dir {settings.models_dir}"

        def chosen(spec: str | None) -> None:
            if spec is not None:
                host.run_worker(self.switch(spec), group="model-switch", exit_on_error=False)

        from radixchat.tui.screens.models import ModelsScreen

        host.app.push_screen(ModelsScreen(catalog, settings.model, where), chosen)

    async def switch(self, spec: str) -> bool:
        """Switch to the model ``spec`` names (False: refused or failed; the old model stays)."""
        host, core = self.host, self.core
        if host.in_flight is not None:
            host.notify(
                "A reply is being generated — stop it (Esc) or let it end, then switch.", severity="warning"
            )
            return False
        loop = asyncio.get_running_loop()

        def progress(text: str) -> None:  # from the loading thread
            loop.call_soon_threadsafe(self._status, text)

        self._status(f"loading {short_name(spec)}…")
        try:
            new = await core.switch_model(spec, self.load, progress)
        except Exception as exc:
            error = str(exc) if isinstance(exc, RadixchatError) else f"{type(exc).__name__}: {exc}"
            host.notify(error, title=f"Still on {core.model_name}", severity="error", timeout=10)
            host.update_status()
            await self.turns.send_queued()
            return False
        if new.base_url is None:
            await asyncio.to_thread(remember, core.settings.cache_dir, spec, new.model_name)
        conv = core.state.conv
        if conv is not None and any(m.role != "system" for m in conv.messages):
            await host.transcript.add(switch_note(new.model_name))
        else:
            await host.transcript.show(conv.messages if conv else [], host.welcome())
        await core.probe_mode()
        host.update_status()
        host.refresh_panels()
        host.notify(f"Switched to {new.model_name}", title="Model", timeout=3)
        announce(host, new)
        await self.sessions.autosave()  # the file records the model the conversation now runs on
        await self.turns.send_queued()
        return True

    def _status(self, text: str) -> None:
        self.core.switch_status = text
        self.host.update_status()


def announce(host: ChatHost, backend: ChatBackend) -> None:
    """Show the backend's load-time notices (a chat template chosen for a model that ships none)."""
    for text in backend.notices:
        host.notify(text, title="Chat template", timeout=12)
