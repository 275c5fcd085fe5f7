"""Files attached to a user message: read, checked, and written into the message as text the model reads.

Text, Markdown and code go in as they are; a PDF as the text of its pages (``pypdf``, imported only when
a PDF is attached). Each becomes a named fenced block, and the blocks come before the question: the model
reads the material first and the question last, as it would read a document handed to it with a note
(and the question stays the end of the prompt, where chat models look for what to do).

A file that is binary, unreadable, too large or a PDF without a text layer raises ``AttachmentError`` with
one line naming the path and why; front ends send nothing then.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from radixchat.errors import RadixchatError

# Larger files are refused before they are read: a file this size is far beyond any local model's
# context anyway, and reading it whole would only stall the front end.
MAX_FILE_BYTES = 8 * 1024 * 1024

# Fence languages by file suffix (lower case); other text files get a bare fence.
LANGUAGES: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".md": "markdown",
    ".markdown": "markdown",
    ".rst": "rst",
    ".txt": "",
    ".json": "json",
    ".jsonl": "json",
    ".toml": "toml",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".ini": "ini",
    ".cfg": "ini",
    ".csv": "csv",
    ".xml": "xml",
    ".html": "html",
    ".htm": "html",
    ".css": "css",
    ".tcss": "css",
    ".js": "javascript",
    ".mjs": "javascript",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".jsx": "jsx",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".rs": "rust",
    ".go": "go",
    ".java": "java",
    ".kt": "kotlin",
    ".rb": "ruby",
    ".php": "php",
    ".swift": "swift",
    ".sh": "bash",
    ".bash": "bash",
    ".zsh": "zsh",
    ".sql": "sql",
    ".lua": "lua",
    ".r": "r",
    ".tex": "latex",
    ".diff": "diff",
    ".patch": "diff",
    ".lark": "lark",
}

AttachmentKind = Literal["text", "pdf"]


class AttachmentError(RadixchatError):
    """A file that cannot be attached (missing, unreadable, binary, too large, a PDF without text)."""


@dataclass(frozen=True, slots=True)
class Attachment:
    """One attached file: its name as the user gave it, and its text as the model will read it."""

    name: str
    text: str
    kind: AttachmentKind = "text"
    language: str = ""  # the fence's info string ("python", "markdown"; "" for plain text)

    def block(self) -> str:
        """The file as a named fenced block. The fence is longer than any run of backticks in the text,
        so nothing inside (a Markdown file's own code blocks) can close it early."""
        longest = max((len(run) for run in re.findall(r"`+", self.text)), default=0)
        fence = "`" * max(3, longest + 1)
        body = self.text if self.text.endswith("\n") or not self.text else self.text + "\n"
        return f"File: {self.name}\n{fence}{self.language}\n{body}{fence}"


def read_attachment(path: Path, name: str | None = None) -> Attachment:
    """Read ``path`` as an attachment named ``name`` (default: the path as given). Raises AttachmentError."""
    shown = name if name is not None else str(path)
    try:
        if not path.is_file():
            why = "is a directory" if path.is_dir() else "no such file"
            raise AttachmentError(f"cannot attach {shown}: {why}")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise AttachmentError(
                f"cannot attach {shown}: {size:,} bytes is over the {MAX_FILE_BYTES:,}-byte limit"
            )
        data = path.read_bytes()
    except OSError as exc:
        raise AttachmentError(f"cannot attach {shown}: {exc.strerror or exc}") from None
    if data.startswith(b"%PDF-"):
        return Attachment(shown, _pdf_text(data, shown), "pdf")
    return Attachment(shown, _plain_text(data, shown), "text", LANGUAGES.get(path.suffix.lower(), ""))


def _plain_text(data: bytes, shown: str) -> str:
    # A NUL byte is valid UTF-8 but never in text a person wrote: images, archives and compiled files.
    if b"\x00" in data:
        raise AttachmentError(
            f"cannot attach {shown}: a binary file (only text, code and PDF can be attached)"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AttachmentError(
            f"cannot attach {shown}: not UTF-8 text (byte {exc.start}); only text, code and PDF can be attached"
        ) from None
    return text.replace("\r\n", "\n")


def _pdf_text(data: bytes, shown: str) -> str:
    import pypdf  # only when a PDF is attached: the app's first frame never pays for it

    # pypdf logs what it repairs in a damaged file; a failure is ours to report (one line), and a log
    # line on stderr would draw over the chat app's screen.
    logging.getLogger("pypdf").disabled = True

    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise AttachmentError(f"cannot attach {shown}: the PDF is encrypted")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except AttachmentError:
        raise
    except Exception as exc:  # a damaged file can fail anywhere in the parser, not only as PyPdfError
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AttachmentError(f"cannot attach {shown}: not a readable PDF ({why})") from None
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise AttachmentError(f"cannot attach {shown}: the PDF has no text layer (a scan?)")
    return text + "\n"


def compose_message(text: str, attachments: Sequence[Attachment]) -> str:
    """The user message: each attachment's block, then the question (just ``text`` without attachments)."""
    if not attachments:
        return text
    blocks = "\n\n".join(a.block() for a in attachments)
    return f"{blocks}\n\n{text}" if text.strip() else blocks


# ``@path`` or ``@"path with spaces"``, at the start or after whitespace (so an e-mail address is not one).
MENTION = re.compile(r'(?<!\S)@(?:"([^"\n]+)"|(\S+))')
# Punctuation that ends a sentence more often than a file name: "see @notes.md." attaches notes.md.
TRAILING = ".,;:!?)]}'\""


def mentioned_files(text: str, base: Path) -> list[str]:
    """The files ``text`` mentions as ``@path`` (relative to ``base``, absolute, or from ``~``), in order,
    each once, as written. An ``@`` word that names no file (``@alice``, a folder) is plain text."""
    found: list[str] = []
    for match in MENTION.finditer(text):
        word = match.group(1) or match.group(2)
        for name in (word, word.rstrip(TRAILING)):
            if name and name not in found and _resolve(name, base).is_file():
                found.append(name)
                break
    return found


def _resolve(name: str, base: Path) -> Path:
    return base / Path(name).expanduser()


def read_mentioned(text: str, base: Path) -> list[Attachment]:
    """The attachments ``text`` mentions (``mentioned_files``), read. Raises AttachmentError."""
    return [read_attachment(_resolve(name, base), name) for name in mentioned_files(text, base)]


def complete_path(word: str, base: Path) -> str | None:
    """``word`` (what follows an ``@``) completed as far as the entries of its folder agree, a folder
    with its ``/``; None when nothing matches or nothing is left to add. Hidden entries only for a word
    that starts them with a dot."""
    folder, _, prefix = word.rpartition("/")
    where = _resolve(folder or ".", base) if folder else base
    try:
        names = sorted(
            entry.name + ("/" if entry.is_dir() else "")
            for entry in where.iterdir()
            if entry.name.startswith(prefix) and (prefix.startswith(".") or not entry.name.startswith("."))
        )
    except OSError:
        return None
    if not names:
        return None
    common = names[0] if len(names) == 1 else _common_prefix(names)
    done = f"{folder}/{common}" if folder else common
    return done if done != word else None


def _common_prefix(names: list[str]) -> str:
    first, last = min(names), max(names)
    size = next((i for i, (a, b) in enumerate(zip(first, last)) if a != b), min(len(first), len(last)))
    return first[:size]
