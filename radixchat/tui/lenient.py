"""Lenient JSON mode in the app: a schema that strict mode refuses for a keyword the grammar cannot
enforce is offered to run leniently (a dialog); once the user agrees, a notice lists the keywords not
enforced while generating, and each finished reply is checked against the whole schema with
``jsonschema`` (``chat/schema_check.py``), its breaches shown as a notice.

The functions read and set the session's ``ChatState`` and show what they do through a ``LenientHost``
(the chat screen), using only the members the protocol names (``tui/host.py``), so this module does not
import the screen. Lenient mode is offered on the refusal's type (``UnenforceableSchemaError``), never
on its words.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from radixchat.chat.modes import ModeError, UnenforceableSchemaError
from radixchat.chat.schema_check import schema_errors, unenforced_keywords
from radixchat.tui.host import ChatHost

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from textual.worker import Worker

    from radixchat.chat.backend import TurnResult
    from radixchat.chat.modes import Mode
    from radixchat.tui.state import ChatState


class LenientHost(ChatHost, Protocol):
    """What lenient mode uses of the chat screen."""

    async def action_set_mode(self, mode: Mode) -> None: ...
    def run_worker(self, work: Coroutine[Any, Any, Any]) -> Worker[Any]: ...


def offer_lenient(host: LenientHost, s: ChatState, problem: ModeError) -> bool:
    """A strict schema failed on what only lenient mode can run: ask the user (True: asked)."""
    if s.mode != "json" or s.lenient or not isinstance(problem, UnenforceableSchemaError):
        return False

    def answer(yes: bool | None) -> None:
        if yes:
            s.lenient = True
            host.run_worker(host.action_set_mode("json"))

    question = (
        f"{problem}\n\nRun this schema leniently? The grammar enforces what it can; each reply is then "
        "checked against the whole schema and what it breaks is shown."
    )
    from radixchat.tui.screens.dialogs import ConfirmDialog  # on first use: not needed for the first frame

    host.app.push_screen(ConfirmDialog(question, yes="Run leniently"), answer)
    return True


def lenient_notice(host: LenientHost, s: ChatState) -> None:
    """In lenient JSON mode: say which of the schema's keywords are checked only after each reply."""
    if s.mode == "json" and s.lenient:
        missing = unenforced_keywords(s.schema) or ["a oneOf whose branches may overlap"]
        host.notify(
            "Not enforced while generating (checked after each reply): " + "; ".join(missing),
            title="Lenient JSON mode",
            severity="warning",
            timeout=12,
        )


async def check_reply(host: LenientHost, s: ChatState, result: TurnResult) -> None:
    """In lenient JSON mode: show what a finished reply breaks of the schema (nothing when valid)."""
    if s.mode == "json" and s.lenient:
        errors = await asyncio.to_thread(schema_errors, s.schema, result.message.content)
        if errors:
            host.notify(
                "\n".join(errors), title="The reply breaks the schema", severity="warning", timeout=15
            )
