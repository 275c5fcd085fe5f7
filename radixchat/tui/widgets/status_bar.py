"""The line above the prompt: the current mode (always visible), model, session, branch, activity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Static

from radixchat.tui.context import NOTICE_SHARE

if TYPE_CHECKING:
    from radixchat.tui.context import ContextUse


@dataclass(slots=True)
class StatusInfo:
    mode: str = "chat"
    mode_problem: str | None = None  # e.g. ModeError's message when the mode cannot be used yet
    model: str = ""
    session: str | None = None
    branch: tuple[int, int] = (1, 1)
    activity: str = ""  # loading… / generating… / editing message 3


class StatusBar(Horizontal):
    def compose(self) -> ComposeResult:
        yield Static("", classes="mode", markup=False)
        yield Static("", classes="activity", markup=False)
        yield Static("", classes="info", markup=False)

    def show(self, info: StatusInfo, context: ContextUse | None = None) -> None:
        """``context``: how much of the model's context the conversation uses (None: not known)."""
        if len(self.children) < 3:  # not composed yet, or already torn down
            return
        mode = self.query_one(".mode", Static)
        mode.update(f" {info.mode} " + ("⚠ " if info.mode_problem else ""))
        for name in ("chat", "json", "tool"):
            mode.set_class(info.mode == name, f"-{name}")
        mode.set_class(info.mode_problem is not None, "-problem")
        mode.tooltip = info.mode_problem
        activity = info.activity or (info.mode_problem or "")
        self.query_one(".activity", Static).update(activity)
        self.set_class(bool(activity), "-busy")
        parts = [info.model or "no model"]
        parts.append(f"session {info.session}" if info.session else "unsaved")
        if info.branch[1] > 1:
            parts.append(f"branch {info.branch[0]}/{info.branch[1]}")
        if context is not None:
            parts.append(context.label())
        info_view = self.query_one(".info", Static)
        info_view.update(" · ".join(parts))
        info_view.set_class(context is not None and context.share >= NOTICE_SHARE, "-context-full")
