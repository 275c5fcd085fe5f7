"""An assistant reply: streamed as Markdown, then rendered once in full, with a stats footer.

Streaming uses ``Markdown.get_stream`` (write each delta, then ``stop``) and one final ``update()``:
per-token ``update()`` re-parses the whole reply each time, and without the final update a closed code fence can stay blank.
A reply that calls tools shows each call as a ``ToolCallBlock`` (between its text and its footer), not
the ``<tool_call>`` JSON it wrote. A thinking model's reasoning streams into a folded ``ThinkingBlock``
above the answer.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from markdown_it import MarkdownIt
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Markdown, Static

from radixchat.chat.conversation import Message
from radixchat.chat.thinking import ThinkingDelta
from radixchat.chat.usage import footer_from_meta
from radixchat.tool_format import CallFilter, strip_tool_calls
from radixchat.tui.messages import RegenerateRequested
from radixchat.tui.pacing import WritePacer
from radixchat.tui.widgets.message_view import MessageView
from radixchat.tui.widgets.thinking import ThinkingBlock
from radixchat.tui.widgets.tool_call import ToolCallBlock

_md = MarkdownIt("commonmark")


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced and indented code blocks of ``markdown``, in order."""
    return [t.content for t in _md.parse(markdown) if t.type in ("fence", "code_block")]


def display_text(content: str, mode: str | None, tool_calls: list[dict[str, Any]] | None = None) -> str:
    """What a reply shows: JSON-mode replies pretty-printed (when they parse); in tool mode, or when it
    made calls, its text without the call blocks (the transcript shows those as ``ToolCallBlock``)."""
    text = content
    if mode == "json":
        with contextlib.suppress(ValueError, TypeError):
            text = "```json\n" + json.dumps(json.loads(content), indent=2, ensure_ascii=False) + "\n```"
    if tool_calls or mode == "tool":
        text = strip_tool_calls(text)
    return text


class AssistantMessage(MessageView):
    BINDINGS = [
        Binding("k", "copy_code", "Copy code", id="message.copy_code"),
        Binding("r", "regenerate", "Regenerate", id="message.regenerate", show=False),
    ]

    def __init__(
        self,
        message: Message,
        index: int,
        mode: str | None = None,
        streaming: bool = False,
        results: list[Message] | None = None,
    ) -> None:
        """``results``: the tool messages that answer this message's calls, in order (a rebuilt view)."""
        super().__init__(message, index)
        self.mode = mode or message.meta.get("mode")
        self.streaming = streaming
        self.results = results or []
        self._code_index = 0
        self.streamed: list[str] = []  # answer deltas as they arrived (for tests and copy while streaming)

    def compose(self) -> ComposeResult:
        if not self.streaming and self.message.reasoning:
            yield ThinkingBlock(self.message.reasoning, _thought_tokens(self.message))
        text = (
            "" if self.streaming else display_text(self.message.content, self.mode, self.message.tool_calls)
        )
        body = Markdown(text, classes="body")
        body.display = self.streaming or bool(text)
        yield body
        calls = [] if self.streaming else self.message.tool_calls or []
        for i, call in enumerate(calls):
            yield ToolCallBlock.from_messages(call, self.results[i] if i < len(self.results) else None)
        footer = (
            "generating…"
            if self.streaming
            else footer_from_meta(self.message.meta, self.message.finish_reason)
        )
        yield Static(footer, markup=False, classes="footer")

    def on_mount(self) -> None:
        self.border_title = "assistant"
        self.set_class(self.message.finish_reason == "cancelled", "-stopped")
        self.set_class(self.message.finish_reason == "error", "-error")
        self.set_class(self.streaming, "-streaming")

    @property
    def calls(self) -> list[ToolCallBlock]:
        return list(self.query(ToolCallBlock))

    @property
    def body(self) -> Markdown:
        return self.query_one(Markdown)

    def set_footer(self, text: str) -> None:
        self.query_one(".footer", Static).update(text)

    async def stream_from(
        self, reply: Any, pacer: WritePacer | None = None, hide_calls: bool = False
    ) -> None:
        """Append the text deltas of ``reply``, as often as ``pacer`` says (default: a ``WritePacer``).

        Each write re-renders the last Markdown block (a code fence is highlighted again) and lays the
        screen out again, on the event loop that shares the GIL and the cores with the engine thread:
        writing per token halved the decode speed on a 2-core CPU, so the pacer keeps this thread's CPU
        share small (see ``radixchat.tui.pacing``). Held-back text goes out with a later delta or at the
        end. ``hide_calls`` (tool mode) keeps ``<tool_call>`` blocks out of the text; the footer says a
        call is being written instead.
        """
        stream = Markdown.get_stream(self.body)
        calls = CallFilter() if hide_calls else None
        pacer = pacer or WritePacer()
        pending: list[str] = []
        thought: list[str] = []
        try:
            async for delta in reply:
                if isinstance(delta, ThinkingDelta):
                    thought.append(delta)
                    if pacer.due():
                        await self._think(thought)
                        pacer.wrote()
                    continue
                if thought:
                    await self._think(thought)
                self.streamed.append(delta)
                if calls is not None:
                    seen = calls.calls
                    delta = calls.feed(delta)
                    if calls.calls > seen:
                        self.set_footer("writing a tool call…")
                pending.append(delta)
                if pacer.due():
                    await stream.write("".join(pending))
                    pending.clear()
                    pacer.wrote()
        finally:
            if thought:
                await self._think(thought)
            if calls is not None:
                pending.append(calls.flush())
            if "".join(pending):
                await stream.write("".join(pending))
            await stream.stop()

    @property
    def thinking(self) -> ThinkingBlock | None:
        blocks = self.query(ThinkingBlock)
        return blocks.first() if blocks else None

    async def _think(self, pieces: list[str]) -> None:
        """Show streamed reasoning (the block appears with the first of it)."""
        block = self.thinking
        if block is None:
            block = ThinkingBlock(streaming=True)
            await self.mount(block, before=self.body)
        block.add("".join(pieces), len(pieces))
        pieces.clear()

    async def finish(
        self, message: Message, footer: str, mode: str | None, calls: list[dict[str, Any]] | None = None
    ) -> list[ToolCallBlock]:
        """The reply is over: render it once in full and show its footer. ``calls`` (default: the
        message's) get a pending block each, returned in order for the caller to fill in."""
        self.message, self.mode, self.streaming = message, mode, False
        block = self.thinking
        if message.reasoning and block is None:
            await self.mount(ThinkingBlock(message.reasoning, _thought_tokens(message)), before=self.body)
        elif block is not None and message.reasoning:
            block.finish(message.reasoning, _thought_tokens(message))
        elif block is not None:
            await block.remove()
        calls = calls if calls is not None else message.tool_calls or []
        text = display_text(message.content, mode, calls)
        await self.body.update(text)
        self.body.display = bool(text)
        blocks = [ToolCallBlock(c.get("name", "?"), c.get("arguments", {})) for c in calls]
        if blocks:
            await self.mount_all(blocks, before=self.query_one(".footer"))
        self.set_footer(footer)
        self.remove_class("-streaming")
        self.set_class(message.finish_reason == "cancelled", "-stopped")
        self.set_class(message.finish_reason == "error", "-error")
        return blocks

    def copy_text(self) -> str:
        """The answer (never the thinking)."""
        return "".join(self.streamed) if self.streaming else self.message.content

    def action_copy_code(self) -> None:
        blocks = code_blocks(display_text(self.copy_text(), self.mode, self.message.tool_calls))
        if not blocks:
            self.notify("This message has no code block", severity="warning", timeout=2)
            return
        i = self._code_index % len(blocks)
        self._code_index += 1
        self.app.copy_to_clipboard(blocks[i])
        which = f" {i + 1} of {len(blocks)}" if len(blocks) > 1 else ""
        self.notify(
            f"Copied code block{which} (k again for the next)" if which else "Copied the code block",
            timeout=2,
        )

    def action_regenerate(self) -> None:
        self.post_message(RegenerateRequested())


def _thought_tokens(message: Message) -> int | None:
    return (message.meta.get("usage") or {}).get("reasoning_tokens")
