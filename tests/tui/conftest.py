"""Fixtures for the chat app: a deterministic fake backend, isolated data dirs, a polling ``wait_until``.

``FakeBackend`` implements the chat backend protocol (``ChatBackend``: new_conversation / reply / stats /
cached_path / warm / totals / model_name / fmt) over a character-level tokenizer and the real
``ChatFormat`` and ``Conversation``. Replies are scripted; a reply can be held at a gate so a test can act mid-stream.
``ToolFakeBackend`` also takes tool mode (its replies are scripted from the whole conversation, so a
round after a tool result can answer with it); ``FakeRemoteBackend`` looks like ``RemoteBackend`` to the
app (no engine stats, ``totals()``, usage the server may not report, a stream that can break).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from textual import events

from radixchat.chat.backend import ChatBackend, LoadedKV, StoredKV, TurnResult
from radixchat.chat.conversation import ChatFormat, Conversation
from radixchat.chat.modes import ConstraintSpec
from radixchat.chat.remote import CACHE_TREE_NOTE
from radixchat.chat.remote_link import RemoteTotals
from radixchat.chat.usage import UsageTotals
from radixchat.config import Settings
from radixchat.engine.stats import EngineStats, LastRequest, TreeNodeView
from radixchat.tui.app import RadixChatApp

TERMINAL = (130, 40)


class CharTokenizer:
    """One token per character; ChatML template; ``<|im_end|>`` is a single token (id 1)."""

    chat_template = "chatml"
    eos_token = "<|im_end|>"
    EOS = 1

    def apply_chat_template(
        self, messages, tools=None, add_generation_prompt=False, tokenize=False, chat_template=None
    ):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            if text.startswith(self.eos_token, i):
                out.append(self.EOS)
                i += len(self.eos_token)
            else:
                out.append(ord(text[i]) + 2)
                i += 1
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.eos_token if t == self.EOS else chr(t - 2) for t in ids)

    def __len__(self) -> int:  # the vocabulary size: every code point, after 0 (unused) and EOS
        return 0x110000 + 2


class FakeTrie:
    """A compressed trie over every sequence the fake 'cached', drawn like the engine's tree."""

    def __init__(self) -> None:
        self.seqs: list[list[int]] = []

    def insert(self, ids: list[int]) -> None:
        self.seqs.append(list(ids))

    def prefix_len(self, ids: Sequence[int]) -> int:
        best = 0
        for s in self.seqs:
            n = 0
            while n < min(len(s), len(ids)) and s[n] == ids[n]:
                n += 1
            best = max(best, n)
        return best

    def build(self) -> list[tuple[int, int | None, list[int]]]:
        """(id, parent id, tokens) breadth-first, children by first token: deterministic ids."""
        root: dict = {}
        for s in self.seqs:
            node = root
            for t in s:
                node = node.setdefault(t, {})
        out: list[tuple[int, int | None, list[int]]] = []
        frontier: list[tuple[int | None, int, dict]] = [(None, t, c) for t, c in sorted(root.items())]
        while frontier:
            nxt = []
            for parent, tok, child in frontier:
                run = [tok]
                while len(child) == 1:
                    ((t2, c2),) = child.items()
                    run.append(t2)
                    child = c2
                nid = len(out) + 1
                out.append((nid, parent, run))
                nxt += [(nid, t, c) for t, c in sorted(child.items())]
            frontier = nxt
        return out

    def nodes(self, decode: Callable[[list[int]], str]) -> list[TreeNodeView]:
        return [
            TreeNodeView(nid, parent, len(run), decode(run[:16]), False, nid)
            for nid, parent, run in self.build()
        ]

    def path(self, ids: Sequence[int]) -> list[int]:
        kids: dict[int | None, list[tuple[int, list[int]]]] = {}
        for nid, parent, run in self.build():
            kids.setdefault(parent, []).append((nid, run))
        out, pos, parent = [], 0, None
        while pos < len(ids):
            hit = next(((nid, run) for nid, run in kids.get(parent, []) if run[0] == ids[pos]), None)
            if hit is None:
                break
            out.append(hit[0])
            if list(ids[pos : pos + len(hit[1])]) != hit[1]:
                break
            pos += len(hit[1])
            parent = hit[0]
        return out


@dataclass
class Script:
    """What the fake says. ``reply_for(prompt_text)`` gives the reply; chunks are sent one per tick."""

    reply_for: Callable[[str], str] = lambda prompt: f"You said: **{prompt}**"
    chunk: int = 4
    gate: asyncio.Event | None = None  # when set, each chunk after the first waits for it
    replies: list[str] = field(default_factory=list)  # the prompts asked, in order


class FakeReply:
    def __init__(self, backend: FakeBackend, conv: Conversation, text: str, dropped_turns: int = 0) -> None:
        self.backend, self.conv, self.text = backend, conv, text
        self.dropped_turns = dropped_turns
        self.cancelled = False
        self.prompt_ids = conv.prompt_ids()
        self.cached = min(backend.trie.prefix_len(self.prompt_ids), len(self.prompt_ids) - 1)  # as the engine
        self._sent: list[str] = []
        self._result: TurnResult | None = None

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self):
        return self._stream()

    async def _stream(self):
        script = self.backend.script
        pieces = [self.text[i : i + script.chunk] for i in range(0, len(self.text), script.chunk)]
        for i, piece in enumerate(pieces):
            if self.cancelled:
                break
            if i and script.gate is not None:
                while not script.gate.is_set() and not self.cancelled:
                    await asyncio.sleep(0.005)
                if self.cancelled:
                    break
            await asyncio.sleep(0)
            self._sent.append(piece)
            yield piece
        self._finish()

    def _finish(self) -> None:
        if self._result is not None:
            return
        text = "".join(self._sent)
        reason = "cancelled" if self.cancelled else "stop"
        fmt = self.conv.fmt
        ids = fmt.encode(text) + ([] if self.cancelled else [CharTokenizer.EOS])
        self.conv.add_assistant(
            text,
            ids,
            reason,
            usage={
                "prompt_tokens": len(self.prompt_ids),
                "cached_tokens": self.cached,
                "completion_tokens": len(ids),
            },
            ttft_ms=12.0,
            decode_tokens_per_s=42.0,
        )
        self.backend.trie.insert(self.prompt_ids + ids[:-1])
        self.backend.last = LastRequest(len(self.prompt_ids), self.cached, len(ids), 0.012, 42.0)
        self.backend.counts[0] += len(self.prompt_ids)
        self.backend.counts[1] += self.cached
        self.backend.counts[2] += 1
        self._result = TurnResult(
            self.conv.messages[-1],
            reason,
            len(self.prompt_ids),
            self.cached,
            len(ids),
            12.0,
            42.0,
            dropped_turns=self.dropped_turns,
        )

    async def result(self) -> TurnResult:
        if self._result is None:
            async for _ in self:
                pass
        assert self._result is not None
        return self._result


class FakeBackend(ChatBackend):
    model_name = "fake-model"
    context_tokens = 4096  # one token a character (CharTokenizer): the status bar shows the share

    def __init__(self, script: Script | None = None, kv: dict[str, list[int]] | None = None) -> None:
        self.fmt = ChatFormat(CharTokenizer())
        self.script = script or Script()
        self.trie = FakeTrie()
        self.last: LastRequest | None = None
        self.counts = [0, 0, 0]  # prompt tokens, cached tokens, replies
        self.warmed: list[list[int]] = []
        self.grammars: list[Any] = []
        self.kv: dict[str, list[int]] | None = kv  # None: no KV store (as a remote backend)
        self.kv_full = False
        self.loads: list[int] = []  # tokens each load_kv found stored

    def new_conversation(self, system: str | None = None, tools: list[dict] | None = None) -> Conversation:
        return Conversation(self.fmt, system=system, tools=tools)

    def reply(self, conv: Conversation, params: Any, grammar: Any = None) -> FakeReply:
        dropped = conv.fit_context(self.context_tokens, 64, self.context_overflow)  # as every backend does
        prompt = next(m.content for m in reversed(conv.messages) if m.role == "user")
        self.script.replies.append(prompt)
        self.grammars.append(grammar)
        return FakeReply(self, conv, self.script.reply_for(prompt), dropped)

    async def aclose(self) -> None:
        self.closed = True

    def warm(self, ids: Sequence[int]) -> None:
        self.warmed.append(list(ids))
        self.trie.insert(list(ids)[:-1])

    def stats(self) -> EngineStats:
        nodes = self.trie.nodes(self.fmt.decode)
        tree_tokens = sum(n.num_tokens for n in nodes)
        prompt, cached, _ = self.counts
        return EngineStats(
            model=self.model_name,
            device="cpu",
            dtype="float32",
            running=0,
            waiting=0,
            prompt_tokens=prompt,
            cached_tokens=cached,
            computed_tokens=tree_tokens,
            generated_tokens=0,
            retractions=0,
            evicted_tokens=0,
            steps=0,
            pool_capacity=4096,
            pool_free=4096 - tree_tokens,
            tree_tokens=tree_tokens,
            tree_evictable=tree_tokens,
            tree_protected=0,
            bytes_per_token=46080,
            device_allocated=None,
            device_reserved=None,
            process_rss=512 * 2**20,
            tree_version=len(self.trie.seqs),
            tree=tuple(nodes),
            last_request=self.last,
        )

    def cached_path(self, ids: Sequence[int]) -> list[int]:
        return self.trie.path(ids)

    def totals(self) -> UsageTotals:
        prompt, cached, replies = self.counts
        return UsageTotals(replies, prompt, cached, 0, replies, cached / prompt if prompt else 0.0)

    # A KV store in memory (``kv``: owner -> ids stored, shared between fakes as a disk would be):
    # 1,000 bytes a token; ``kv_full`` makes saves fail as a full disk does (a notice, never an error).
    @property
    def has_kv_store(self) -> bool:
        return self.kv is not None

    def save_kv(self, ids: Sequence[int], owner: str) -> StoredKV | None:
        if self.kv is None:
            return None
        if self.kv_full:
            return StoredKV(0, 0, "KV not saved: No space left on device")
        self.kv[owner] = list(ids)
        return StoredKV(len(ids), len(ids) * 1000)

    def load_kv(self, ids: Sequence[int]) -> LoadedKV:
        best = 0
        for stored in (self.kv or {}).values():
            n = 0
            while n < min(len(stored), len(ids)) and stored[n] == ids[n]:
                n += 1
            best = max(best, n)
        cached = self.trie.prefix_len(ids)
        if best > cached:
            self.trie.insert(list(ids[:best]))
        self.loads.append(best)
        return LoadedKV(cached, max(0, best - cached))

    def kv_usage(self) -> dict[str, StoredKV]:
        return {o: StoredKV(len(ids), len(ids) * 1000) for o, ids in (self.kv or {}).items()}

    def delete_kv(self, owner: str) -> int:
        ids = (self.kv or {}).pop(owner, None)
        return 0 if ids is None else len(ids) * 1000

    def rename_kv(self, old: str, new: str) -> bool:
        if self.kv is None or old not in self.kv:
            return False
        self.kv[new] = self.kv.pop(old)
        return True


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A call as the tool grammar makes the model write it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class ToolFakeBackend(FakeBackend):
    """Takes tool mode; ``plan(conv)`` writes each reply from the whole conversation (the grammar it gets
    is recorded in ``constraints``, not applied)."""

    def __init__(self, plan: Callable[[Conversation], str], script: Script | None = None) -> None:
        super().__init__(script)
        self.plan = plan
        self.constraints: list[tuple[str, list[str], Any]] = []  # (mode, tool names, tool_choice)

    def constraint(self, spec: ConstraintSpec) -> Any:
        self.constraints.append((spec.mode, [t["name"] for t in spec.tools or []], spec.tool_choice))
        return ("grammar", spec.mode)

    def reply(self, conv: Conversation, params: Any, grammar: Any = None) -> FakeReply:
        dropped = conv.fit_context(self.context_tokens, 64, self.context_overflow)
        self.grammars.append(grammar)
        return FakeReply(self, conv, self.plan(conv), dropped)


def call_then_answer(name: str, arguments: dict[str, Any]) -> Callable[[Conversation], str]:
    """Call ``name`` for each user message; after its result, answer with it."""

    def plan(conv: Conversation) -> str:
        last = conv.messages[-1]
        if last.role == "tool":
            return f"The tool said: {last.content}"
        return tool_call_text(name, arguments)

    return plan


class FakeRemoteReply(FakeReply):
    """As ``RemoteReply`` reports: usage only as far as the server gives it; a broken stream keeps what
    came (``meta["partial"]``, finish reason ``error``)."""

    def _finish(self) -> None:
        if self._result is not None:
            return
        backend: FakeRemoteBackend = self.backend  # type: ignore[assignment]
        text = "".join(self._sent)
        reason, error = "cancelled" if self.cancelled else "stop", None
        if backend.break_after is not None:
            text, reason = text[: backend.break_after], "error"
            error = (
                f"the server at {backend.base_url} closed the connection mid-reply; the partial reply is kept"
            )
        prompt, cached = backend.usage
        usage = {"prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": len(text)}
        self.conv.add_assistant(
            text,
            [],
            reason,
            usage={k: v for k, v in usage.items() if v is not None},
            ttft_ms=80.0,
            decode_tokens_per_s=25.0,
        )
        msg = self.conv.messages[-1]
        if error is not None:
            msg.meta.update(error=error, partial=True)
        self._result = TurnResult(msg, reason, prompt, cached, len(text), 80.0, 25.0, error)
        backend.remote_totals.add(self._result)


class FakeRemoteBackend(FakeBackend):
    """What the app sees of ``RemoteBackend``: ``stats()`` is None, ``totals()``, ``cache_tree_note``."""

    model_name = "served-model"
    base_url = "http://gpu-box:30000/v1"

    def __init__(self, script: Script | None = None) -> None:
        super().__init__(script, kv=None)
        self.remote_totals = RemoteTotals()
        self.cache_tree_note = CACHE_TREE_NOTE.format(url=self.base_url)
        self.usage: tuple[int | None, int | None] = (None, None)  # what the server reports next
        self.break_after: int | None = None  # characters after which the next stream breaks

    def reply(self, conv: Conversation, params: Any, grammar: Any = None) -> FakeReply:
        prompt = next(m.content for m in reversed(conv.messages) if m.role == "user")
        self.script.replies.append(prompt)
        return FakeRemoteReply(self, conv, self.script.reply_for(prompt))

    def stats(self) -> None:  # type: ignore[override]
        return None

    def cached_path(self, ids: Sequence[int]) -> list[int]:
        return []

    def totals(self) -> UsageTotals:
        return self.remote_totals.snapshot()


def wait_until_sync(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, pilot: Any = None) -> None:
    """Poll ``predicate`` (letting the app run) until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        if pilot is not None:
            await pilot.pause(0.02)
        else:
            await asyncio.sleep(0.02)


@pytest.fixture
def tui_env(tmp_path, monkeypatch) -> Path:
    """Isolated config and data directories."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("RADIXCHAT_CONFIG", raising=False)
    return tmp_path


@pytest.fixture
def settings(tui_env) -> Settings:
    return Settings.load({"sessions_dir": str(tui_env / "sessions"), "model": "fake-model", "max_tokens": 64})


@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def make_app(settings, fake):
    """Build an app over the fake backend (panels polled by hand)."""

    def make(backend: Any = None, **kwargs: Any) -> RadixChatApp:
        b = backend or fake
        kwargs.setdefault("panel_interval", None)
        return RadixChatApp(kwargs.pop("settings", settings), backend_factory=lambda s, progress: b, **kwargs)

    return make


def burst(app: RadixChatApp, *keys: str) -> None:
    """Post ``keys`` to the app at once, as a terminal delivers keys that arrive in one read (fast typing,
    tmux send-keys, a paste without bracketed paste); ``pilot.press`` waits for the app between keys."""
    for key in keys:
        app.post_message(events.Key(key, key if len(key) == 1 else None))


async def ready(app: RadixChatApp, pilot: Any) -> None:
    await wait_until(lambda: app.backend is not None and app.chat.state.conv is not None, pilot=pilot)
    await pilot.pause()


async def say_mid_reply(app: RadixChatApp, pilot: Any, fake: Any, text: str) -> None:
    """Send ``text`` and return once its (long, gated) reply has streamed its first chunk, "ab"."""
    fake.script = Script(reply_for=lambda p: "abcdefghijklmnopqrstuvwxyz" * 4, chunk=2, gate=asyncio.Event())
    await say(app, pilot, text, wait=False)
    await wait_until(lambda: app.chat.reply_view is not None and app.chat.reply_view.streamed, pilot=pilot)


async def say(app: RadixChatApp, pilot: Any, text: str, wait: bool = True, timeout: float = 30.0) -> None:
    """Type ``text`` into the prompt, press Enter, and (by default) wait until the turn is fully handled."""
    app.chat.prompt.focus()
    app.chat.prompt.load_text(text)
    done = app.chat.turns_finished
    await pilot.press("enter")
    if wait:
        await turn_done(app, pilot, done, timeout)


async def turn_done(app: RadixChatApp, pilot: Any, before: int, timeout: float = 30.0) -> None:
    """Wait until a reply started after ``app.chat.turns_finished`` was ``before`` is rendered and saved."""
    await wait_until(lambda: app.chat.turns_finished > before, timeout=timeout, pilot=pilot)
    await pilot.pause()
