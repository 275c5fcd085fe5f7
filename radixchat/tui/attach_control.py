"""Attachments in the chat app: the files the prompt mentions (``@path``, relative to the working
directory), measured while it is typed, read into the message when it is sent; and the file picker.

The bar above the prompt (``AttachmentBar``) shows each file and its tokens before anything is sent;
reading and tokenizing run in a thread (a file can be megabytes), and a file is measured again only when
it changes. Sending reads the files afresh: a file that cannot be attached keeps the message in the box
with a one-line notice, and the backend refuses a message that cannot fit the context
(``ContextOverflowError``, the same notice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from radixchat.chat.attachments import (
    AttachmentError,
    compose_message,
    mentioned_files,
    read_attachment,
    read_mentioned,
)
from radixchat.tui.chat_core import ChatCore
from radixchat.tui.host import ChatHost
from radixchat.tui.widgets.attachment_bar import AttachmentInfo

if TYPE_CHECKING:
    from radixchat.tui.widgets.attachment_bar import AttachmentBar


class AttachControl:
    def __init__(self, core: ChatCore, host: ChatHost, base: Callable[[], Path] = Path.cwd) -> None:
        self.core = core
        self.host = host
        self.base = base  # where @paths start: the working directory, when each is read
        # Measured files by (path, modification time, size): typing around a mention reads it once.
        self._sizes: dict[tuple[Path, int, int], AttachmentInfo] = {}

    async def measure(self, text: str, bar: AttachmentBar) -> None:
        """Show on ``bar`` what ``text`` attaches (the screen's exclusive worker, on each change)."""
        if "@" not in text and not bar.items:
            return
        items = await asyncio.to_thread(self._measure, text)
        if self.host.prompt.text != text:
            return  # typed on meanwhile: a newer measure shows its own
        backend = self.core.backend
        bar.show_items(items, backend.context_tokens if backend is not None else None)

    def _measure(self, text: str) -> list[AttachmentInfo]:
        base, backend = self.base(), self.core.backend
        items = []
        for name in mentioned_files(text, base):
            path = base / Path(name).expanduser()
            try:
                stat = path.stat()
                key = (path, stat.st_mtime_ns, stat.st_size)
            except OSError as exc:
                items.append(AttachmentInfo(name, error=f"cannot attach {name}: {exc.strerror or exc}"))
                continue
            known = self._sizes.get(key)
            if known is None or (known.tokens is None and backend is not None):
                try:
                    block = read_attachment(path, name).block()
                    tokens = backend.count_tokens(block) if backend is not None else None
                    known = AttachmentInfo(name, tokens)
                except AttachmentError as exc:
                    known = AttachmentInfo(name, error=str(exc))
                self._sizes[key] = known
            items.append(known)
        return items

    async def message(self, text: str) -> str | None:
        """The message to send for ``text``: its attachments read (afresh), then the text. None, with a
        notice, when a file cannot be attached."""
        if "@" not in text:
            return text
        try:
            attachments = await asyncio.to_thread(read_mentioned, text, self.base())
        except AttachmentError as exc:
            self.host.notify(str(exc), title="Not sent", severity="error")
            return None
        return compose_message(text, attachments)

    def insert(self, path: Path) -> None:
        """Mention ``path`` at the prompt's cursor (relative to the working directory when inside it)."""
        base = self.base()
        try:
            name = str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            name = str(path)
        mention = f'@"{name}"' if any(c.isspace() for c in name) else f"@{name}"
        prompt = self.host.prompt
        row, col = prompt.cursor_location
        before = prompt.document.get_line(row)[:col]
        prompt.insert(("" if not before or before[-1].isspace() else " ") + mention + " ")
        prompt.focus()

    def pick(self) -> None:
        """Open the file picker; the chosen file is mentioned at the prompt's cursor."""
        from radixchat.tui.screens.attach import AttachScreen  # a dialog loads when it opens

        def chosen(path: Path | None) -> None:
            if path is not None:
                self.insert(path)

        self.host.app.push_screen(AttachScreen(self.base()), chosen)
