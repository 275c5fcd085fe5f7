"""Thinking: the text a reasoning model writes between ``<think>`` and ``</think>`` before its answer.

A reply of a thinking model is two streams: the reasoning and the answer. ``ThinkingSplitter`` separates
them from the text as it streams (the tags may arrive split over several deltas); a reply that never opens
the tag is all answer. A reply starts inside the thinking when the rendered prompt already ends with the
open tag (the R1 distills' templates write it into the generation prompt).

Front ends tell the two apart by type: a reply yields ``ThinkingDelta`` (a ``str``) for reasoning text and
plain ``str`` for the answer. The finished message keeps them apart too (``Message.reasoning`` beside
``Message.content``).

Torch-free: the remote path and the session files use it.
"""

from __future__ import annotations

from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


class ThinkingDelta(str):
    """A piece of a reply's reasoning (plain ``str`` deltas are its answer)."""

    __slots__ = ()


def template_thinks(template: str | None, tokenizer: Any = None) -> bool:
    """Whether a model writes thinking: its chat template mentions the tags, or its vocabulary has them
    as tokens (decided from the template and tokenizer, never from a list of model names)."""
    if template and (THINK_OPEN in template or THINK_CLOSE in template):
        return True
    vocab = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else {}
    return THINK_OPEN in vocab and THINK_CLOSE in vocab


def prompt_opens_thinking(prompt_text: str) -> bool:
    """Whether the rendered prompt ends inside the thinking (its generation prompt wrote the open tag)."""
    return prompt_text.rstrip().endswith(THINK_OPEN)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper beginning of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkingSplitter:
    """Splits streamed reply text into reasoning and answer.

    ``feed`` returns the deltas ready to show (``ThinkingDelta`` or ``str``), holding back only what may
    still turn out to be a tag; ``flush`` returns what is held at the end. Whitespace around the tags
    (``<think>\\n…\\n</think>\\n\\n``) is not shown."""

    def __init__(self, inside: bool = False) -> None:
        # start: nothing but whitespace yet; think: in the reasoning; gap: after the close tag, before
        # the answer's first visible character; answer.
        self._state = "think" if inside else "start"
        self._buf = ""
        self._lead = True  # the reasoning has shown nothing yet (its leading whitespace is skipped)
        self._thinking: list[str] = []
        self._answer: list[str] = []
        self.opened = inside

    @property
    def in_thinking(self) -> bool:
        return self._state == "think"

    @property
    def reasoning(self) -> str | None:
        """The reasoning so far (None: the reply did not think, or thought nothing)."""
        text = "".join(self._thinking).strip()
        return text or None

    @property
    def answer(self) -> str:
        return "".join(self._answer)

    def feed(self, text: str) -> list[str]:
        out: list[str] = []
        self._buf += text
        while self._buf:
            if self._state == "start":
                stripped = self._buf.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._state, self.opened = "think", True
                    self._buf = stripped[len(THINK_OPEN) :]
                elif THINK_OPEN.startswith(stripped):
                    break  # only whitespace, or the beginning of the tag: wait for more
                else:
                    self._state = "answer"
            elif self._state == "think":
                end = self._buf.find(THINK_CLOSE)
                if end >= 0:
                    self._think(self._buf[:end], out)
                    self._state, self._buf = "gap", self._buf[end + len(THINK_CLOSE) :]
                    continue
                keep = _partial_suffix(self._buf, THINK_CLOSE)
                self._think(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep :]
                break
            elif self._state == "gap":
                self._buf = self._buf.lstrip()
                if self._buf:
                    self._state = "answer"
            else:
                self._say(self._buf, out)
                self._buf = ""
        return out

    def flush(self) -> list[str]:
        """What is held back, at the end of the reply (a lone beginning of a tag is text after all)."""
        out: list[str] = []
        if self._state == "think":
            self._think(self._buf, out)
        elif self._state in ("start", "answer"):
            self._say(self._buf, out)
        self._buf = ""
        return out

    def _think(self, text: str, out: list[str]) -> None:
        if self._lead:
            text = text.lstrip()
        if text:
            self._lead = False
            self._thinking.append(text)
            out.append(ThinkingDelta(text))

    def _say(self, text: str, out: list[str]) -> None:
        if text:
            self._answer.append(text)
            out.append(text)


def split_thinking(text: str, inside: bool = False) -> tuple[str | None, str]:
    """(reasoning, answer) of a whole reply's text."""
    splitter = ThinkingSplitter(inside)
    splitter.feed(text)
    splitter.flush()
    return splitter.reasoning, splitter.answer
