"""The app's session files: saving the open session (``SessionKeeper``), and the session browser's file
operations (list, rename, delete, export to Markdown).

Reading and writing go through ``radixchat.chat.session`` (validation, atomic writes), in a thread so a
slow disk never stalls the window. A file that does not load is listed with its error and never
rewritten.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from radixchat.chat.backend import ChatBackend, kv_owner
from radixchat.chat.session import SessionFile, atomic_write_text, load_session, save_session, session_path
from radixchat.chat.usage import footer_from_meta
from radixchat.errors import SessionError
from radixchat.tool_format import strip_tool_calls
from radixchat.tui.state import ChatState, auto_session_name
from radixchat.tui.tools import call_signature


class SessionKeeper:
    """Saves the open session (the active branch and the others) into ``folder``, one write at a time:
    an autosave still in flight must not land after a rename removed its file.

    Once ``backend()`` gives one (the app's, asked of its owner, ``ChatCore``), each save also stores the
    KV of the active branch's tokens in its KV store (after the file, best effort), so the session
    reopens warm; ``kv_notice`` is the last save's one line on KV it could not store."""

    def __init__(
        self, state: ChatState, folder: Path, backend: Callable[[], ChatBackend | None] = lambda: None
    ) -> None:
        self.state = state
        self.folder = Path(folder)
        self.backend = backend
        self.kv_notice: str | None = None
        self._lock = asyncio.Lock()

    def has_turns(self) -> bool:
        conv = self.state.conv
        return conv is not None and any(m.role == "assistant" for m in conv.messages)

    async def write(self, name: str, replaces: Path | None = None) -> Path:
        """Save as ``name`` (then remove ``replaces``: a rename). Raises OSError / ValueError."""
        async with self._lock:
            session = self.state.to_session(name)
            conv, backend = self.state.conv, self.backend()
            ids = conv.ids if conv is not None else []
            saved = await asyncio.to_thread(self.state.write, session, self.folder, backend, ids)
            path = saved.path
            if replaces is not None and replaces.resolve() != path.resolve():
                replaces.unlink(missing_ok=True)
                if backend is not None:
                    await asyncio.to_thread(backend.delete_kv, kv_owner(replaces))
            self.kv_notice = saved.kv_notice
        return path

    async def autosave(self) -> bool:
        """After each completed turn: save under the session's name (made up the first time). False
        when there was nothing to save."""
        if not self.has_turns():
            return False
        s = self.state
        if s.session_name is None:
            s.session_name, s.auto_named = auto_session_name(), True
        await self.write(s.session_name)
        return True

    async def export_markdown(self) -> Path:
        """The open session as Markdown next to its file (named now if it has no name yet)."""
        name = self.state.session_name or auto_session_name()
        session = self.state.to_session(name)
        return await asyncio.to_thread(export_markdown, session, markdown_path(self.folder, name))


@dataclass(frozen=True, slots=True)
class SessionEntry:
    name: str
    path: Path
    model: str = ""
    turns: int = 0
    modified: datetime | None = None
    error: str | None = None
    text: str = ""  # what the browser's search looks in: the system prompt and every branch's messages


def session_text(session: SessionFile) -> str:
    """The text of a session, one message a line: its system prompt, then the messages of every branch
    (a message the branches share appears once)."""
    parts = [session.system_prompt] if session.system_prompt else []
    seen: set[tuple[str, str]] = set()
    for messages in [session.messages, *(b.messages for b in session.branches)]:
        for m in messages:
            if (m.role, m.content) not in seen:
                seen.add((m.role, m.content))
                parts.append(m.content)
    return "\n".join(parts)


def list_sessions(sessions_dir: Path) -> list[SessionEntry]:
    """Every ``*.json`` in ``sessions_dir``, newest first, with its text; unreadable ones carry their error."""
    entries = []
    for path in Path(sessions_dir).glob("*.json"):
        try:
            s = load_session(path)
        except SessionError as exc:
            mtime = datetime.fromtimestamp(path.stat().st_mtime).astimezone()
            entries.append(SessionEntry(path.stem, path, modified=mtime, error=str(exc)))
            continue
        entries.append(SessionEntry(s.name, path, s.model, s.turns, s.updated_at, text=session_text(s)))
    return sorted(entries, key=lambda e: e.modified.timestamp() if e.modified else 0.0, reverse=True)


def snippet(text: str, query: str, width: int = 60) -> str | None:
    """Where ``query`` first occurs in ``text`` (case-insensitive), as one line of about ``width``
    characters around it; None when it does not occur."""
    lowered = text.lower()
    at = lowered.find(query.lower())
    if at < 0:
        return None
    source = text if len(lowered) == len(text) else lowered  # lower() changed lengths: show the lowered
    start = max(0, at - (width - len(query)) // 2)
    end = min(len(source), start + max(width, len(query)))
    start = max(0, min(start, end - width))
    line = " ".join(source[start:end].split())
    return ("…" if start > 0 else "") + line + ("…" if end < len(source) else "")


def search_sessions(entries: list[SessionEntry], query: str) -> list[tuple[SessionEntry, str]]:
    """The entries whose name or text contains ``query`` (case-insensitive), each with a snippet of the
    text where it occurs (empty when only the name matches), in the order given."""
    found = []
    for e in entries:
        hit = snippet(e.text, query)
        if hit is not None:
            found.append((e, hit))
        elif query.lower() in e.name.lower():
            found.append((e, ""))
    return found


def rename_session(sessions_dir: Path, entry: SessionEntry, new_name: str) -> Path:
    """Save under the new name, then remove the old file. Refuses to overwrite another session. A file
    that does not load (``entry.error``) is moved as it is, never rewritten."""
    target = session_path(sessions_dir, new_name)
    if target.exists() and target.resolve() != entry.path.resolve():
        raise SessionError(f"a session named '{target.stem}' already exists")
    if entry.error is not None:
        if target.resolve() != entry.path.resolve():
            entry.path.rename(target)
        return target
    session = load_session(entry.path)
    session.name = new_name
    save_session(session, target)
    if target.resolve() != entry.path.resolve():
        entry.path.unlink(missing_ok=True)
    return target


def delete_session(entry: SessionEntry) -> None:
    entry.path.unlink(missing_ok=True)


def fenced(text: str, info: str = "") -> list[str]:
    """``text`` as a Markdown code block, its fence longer than any run of backticks in it."""
    fence = "`" * max([3, *(len(run) + 1 for run in re.findall(r"`{3,}", text))])
    return [fence + info, text, fence]


def pretty_json(text: str) -> str:
    """A JSON-mode reply as the transcript shows it: indented when it parses, else as it is."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def session_markdown(session: SessionFile) -> str:
    lines = [
        f"# {session.name}",
        "",
        f"*{session.model} · {session.mode} mode · {session.turns} turns · "
        f"saved {session.updated_at:%Y-%m-%d %H:%M}*",
        "",
    ]
    if session.system_prompt:
        lines += ["> **System:** " + session.system_prompt.replace("\n", "\n> "), ""]
    for m in session.messages:
        if m.role == "system":
            continue
        title = {"user": "User", "assistant": "Assistant", "tool": f"Tool {m.name or ''}".strip()}[m.role]
        if m.role == "assistant" and m.tool_calls:
            text = strip_tool_calls(m.content)
            calls = [f"- calls `{call_signature(c['name'], c['arguments'], 200)}`" for c in m.tool_calls]
            lines += [f"## {title}", "", *([text, ""] if text else []), *calls, ""]
        elif m.role == "tool":
            lines += [f"## {title}", "", *fenced(m.content), ""]
        elif m.role == "assistant" and m.meta.get("mode") == "json":
            lines += [f"## {title}", "", *fenced(pretty_json(m.content), "json"), ""]
        else:
            lines += [f"## {title}", "", m.content, ""]
        if m.role == "assistant":
            footer = footer_from_meta(m.meta, m.finish_reason)
            if footer:
                lines += [f"<sub>{footer}</sub>", ""]
    return "\n".join(lines)


def export_markdown(session: SessionFile, path: Path) -> Path:
    atomic_write_text(path, session_markdown(session))
    return path


def markdown_path(sessions_dir: Path, name: str) -> Path:
    return session_path(sessions_dir, name).with_suffix(".md")
