"""What the chat screen knows and decides without Textual: the backend, the session, the tools offered,
and what the next reply is constrained to.

``ChatCore`` is the one owner of the backend: the app hands it over once loaded (``ChatScreen.backend_ready``)
and takes it back to close it (``release``); the session keeper, the controllers (``TurnControl``,
``SessionControl``) and the screen ask the core for it. The core also holds the session state
(``ChatState``), the tool registry and the MCP servers that add to it, where loading stands, and why the current mode cannot be used
(``mode_error``), which it finds by asking the backend for the next reply's constraint (``probe_mode``).
Nothing here draws; the screen shows what the core holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from radixchat.chat.backend import ChatBackend, Constraint, grammar_for
from radixchat.chat.loading import release_memory
from radixchat.chat.mcp_client import McpTools
from radixchat.chat.modes import ConstraintSpec, ModeError
from radixchat.chat.session import SessionFile
from radixchat.errors import RadixchatError
from radixchat.tui.backend import BackendFactory, make_params
from radixchat.tui.session_store import SessionKeeper
from radixchat.tui.state import ChatState, rerendered
from radixchat.tui.tools import build_registry, offered, unknown_tools_problem

if TYPE_CHECKING:
    from radixchat.chat.tools import Tool
    from radixchat.config import Settings
    from radixchat.sampling import SamplingParams


log = logging.getLogger(__name__)


class ModelSwitchError(RadixchatError):
    """A model switch that cannot start now."""


class ChatCore:
    def __init__(self, settings: Settings, session: SessionFile | str | None = None) -> None:
        self.settings = settings
        self.state = ChatState(model=settings.model, system_prompt=settings.system_prompt)
        self.keeper = SessionKeeper(self.state, Path(settings.sessions_dir), lambda: self.backend)
        self.registry, self.tools_problem = build_registry(settings)
        # The MCP servers' tools join the registry once the app has started them (after the first frame).
        self.mcp = (
            McpTools(settings.mcp_servers, self.registry, settings.cache_dir)
            if settings.mcp_servers
            else None
        )
        self._backend: ChatBackend | None = None
        self.mode_error: ModeError | None = None  # why the mode cannot be used now
        self.load_status = "loading the model…"
        self.load_failed = False
        self.switching: str | None = None  # the model a switch is loading (``switch_model``)
        self.switch_status = ""  # how that load goes (its progress lines)
        # Opened once the backend is ready (a session file given at start, or opened while loading).
        self.pending_session: SessionFile | None = session if isinstance(session, SessionFile) else None
        if isinstance(session, str):  # a name with no file yet: a new session by that name
            self.state.session_name = session
        preset = settings.presets.get(settings.preset) if settings.preset is not None else None
        if preset is not None:  # its sampling and system prompt are in the settings already
            self.state.mode = preset.mode or self.state.mode
            if preset.tools is not None:
                self.state.tool_names = list(preset.tools)
                problem = unknown_tools_problem(self.tool_known, settings.preset or "", preset.tools)
                self.tools_problem = "; ".join(p for p in (self.tools_problem, problem) if p) or None
            self.state.tool_choice = preset.tool_choice or self.state.tool_choice

    # -- the backend ----------------------------------------------------------------------------------------

    @property
    def backend(self) -> ChatBackend | None:
        """The backend replies come from: None until loaded, and once released (shutting down)."""
        return self._backend

    def adopt(self, backend: ChatBackend) -> None:
        """The app loaded and started ``backend``: from now on it is the one replies come from."""
        self._backend = backend
        self.state.model = backend.model_name

    def release(self) -> ChatBackend | None:
        """Give the backend up (the app closes it); replies finishing after this find none."""
        backend, self._backend = self._backend, None
        return backend

    @property
    def loading(self) -> str | None:
        """How loading a model goes (the first one, or one being switched to); None: nothing loads."""
        if self._backend is None:
            return self.load_status
        return self.switch_status if self.switching is not None else None

    @property
    def model_name(self) -> str:
        return self._backend.model_name if self._backend else self.settings.model

    async def switch_model(
        self, spec: str, load: BackendFactory, progress: Callable[[str], None] = lambda _: None
    ) -> ChatBackend:
        """Load the model ``spec`` names (``load`` runs in a thread, as the app's first load does; the
        current backend keeps serving meanwhile) and continue the conversation on it: every branch is
        re-rendered from its text with the new model's template (the old tokenizer's ids are dropped, so
        the next turn prefills the history once), the settings name the new model, and the old backend is
        closed and its memory released. Returns the new backend.

        Raises ModelSwitchError (nothing loaded yet, a switch already under way) or whatever the load
        raises (ModelLoadError, ...); then nothing has changed and the old model stays."""
        old = self._backend
        if old is None:
            raise ModelSwitchError("the model is not loaded yet")
        if self.switching is not None:
            raise ModelSwitchError(f"already switching to {self.switching}")
        settings = self.settings.model_copy(update={"model": spec})
        self.switching = spec
        try:
            new = await asyncio.to_thread(load, settings, progress)
            try:
                await new.start()
            except BaseException:
                await new.aclose()
                raise
        finally:
            self.switching = None
        for branch in self.state.branches:
            branch.conv = rerendered(branch.conv, new.fmt, branch.conv.system)
        self.settings, self._backend = settings, new
        self.state.model = new.model_name
        try:
            await old.aclose()
        except Exception:  # the switch is done: an old backend that stops badly is only logged
            log.warning("closing %s after a model switch failed", old.model_name, exc_info=True)
        del old
        await asyncio.to_thread(release_memory)
        return new

    def params(self) -> SamplingParams:
        """The next reply's sampling parameters: the settings' defaults under the session's overrides."""
        return make_params(self.settings, self.state.sampling)

    # -- tools and modes ------------------------------------------------------------------------------------

    def tool_known(self, name: str) -> bool:
        """Whether a tool has ``name``, or may have once the MCP servers still starting have listed theirs."""
        return name in self.registry.tools or (self.mcp is not None and self.mcp.pending(name))

    def offered_tools(self) -> list[Tool]:
        return offered(self.registry, self.state.tool_names)

    def tool_declarations(self) -> list[dict[str, Any]]:
        return [t.declaration() for t in self.offered_tools()]

    @property
    def mode_problem(self) -> str | None:
        """Why the mode cannot be used now (``mode_error``'s message)."""
        return str(self.mode_error) if self.mode_error is not None else None

    def constraint_spec(self) -> ConstraintSpec:
        """What the next reply is constrained to, in the current mode. Lenient applies to JSON mode only."""
        s = self.state
        tools = self.tool_declarations() if s.mode == "tool" else None
        return ConstraintSpec(s.mode, s.schema, tools, s.tool_choice, s.lenient and s.mode == "json")

    async def constraint(self) -> Constraint | ModeError | None:
        """The constraint for the next reply (None: unconstrained) or the ModeError saying why there is
        none. In tool mode this only checks the tools and tool_choice: the tool turn makes one per
        round."""
        try:
            return await asyncio.to_thread(grammar_for, self.backend, self.constraint_spec())
        except ModeError as exc:
            return exc

    async def probe_mode(self) -> None:
        """Ask the backend whether the mode can be used now, to show why not before a send."""
        self.mode_error = None
        if self.backend is not None and self.state.mode != "chat":
            result = await self.constraint()
            self.mode_error = result if isinstance(result, ModeError) else None
