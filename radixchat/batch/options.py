"""The options of one batch run, parsed once from the command line (``radixchat.cli``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BatchOptions:
    source: str  # the JSON Lines file, or "-" for stdin
    output: str | None = None  # the records' file; None or "-": stdout
    ordered: bool = False  # write records in input order (default: as each turn finishes)
    save_sessions: Path | None = None  # save each finished conversation here
    allow_tools: frozenset[str] = frozenset()  # user tools that may run without asking

    @staticmethod
    def tool_names(text: str | None) -> frozenset[str]:
        """``--allow-tools a,b``: the names, blanks dropped."""
        return frozenset(n.strip() for n in (text or "").split(",") if n.strip())
