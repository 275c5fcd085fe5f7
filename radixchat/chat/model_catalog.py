"""The models the chat app can switch to: bundled ones, what lies in ``models_dir``, and recent ones.

Torch-free and quick: the model picker (F7) lists these while the current model keeps running.
``models_dir`` is scanned two levels deep at most (``models_dir/x.gguf``, ``models_dir/org/name/``) and at
most ``SCAN_LIMIT`` entries are looked at, so a huge tree costs a bounded listing, never a deep walk. A
folder counts as a Hugging Face model when it holds ``config.json``.

The recent models are a small JSON file in the cache directory (``<cache_dir>/recent-models.json``),
most recent first, written atomically; a recent model whose file or folder is gone is kept in the list
and marked missing (the picker says so rather than silently forgetting where it was).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from radixchat.bundled import BUNDLED, bundled_model
from radixchat.chat.session import atomic_write_text

log = logging.getLogger(__name__)

Kind = Literal["bundled", "gguf", "folder", "hub", "server"]
SCAN_LIMIT = 500  # entries of models_dir (both levels together) looked at, at most
RECENT_LIMIT = 10
RECENT_FILE = "recent-models.json"
# Files whose sizes make a model folder's size (its weights and tokenizer, not stray subfolders).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".json", ".model", ".txt", ".jinja")


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model the picker offers."""

    name: str  # what the picker shows
    spec: str  # the ``model`` setting that loads it (a bundled alias, a path, a hub id, a served name)
    kind: Kind
    size: int | None = None  # bytes on disk (None: not known here)
    recent: bool = False
    missing: bool = False  # a recent model whose file or folder is gone


def model_key(spec: str) -> str:
    """One spelling per model, to compare specs: a bundled model's alias, a path made absolute, else
    the spec itself (a hub id, a served model's name)."""
    bundled = bundled_model(spec)
    if bundled is not None:
        return bundled.alias
    if looks_like_path(spec):
        return str(Path(spec).expanduser().resolve())
    return spec


def looks_like_path(spec: str) -> bool:
    """A file or folder rather than a hub id (``org/name``) or a bundled alias: as ``resolve_model``
    tells them apart."""
    path = Path(spec).expanduser()
    return path.exists() or spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or spec.count("/") != 1


def bundled_entries() -> list[ModelEntry]:
    """The bundled models whose package is installed."""
    out = []
    for b in BUNDLED:
        size = b.size()
        if size is not None:
            out.append(ModelEntry(b.name, b.alias, "bundled", size))
    return out


def scan_models_dir(folder: Path, limit: int = SCAN_LIMIT) -> list[ModelEntry]:
    """The ``.gguf`` files and model folders (with ``config.json``) in ``folder`` and its subfolders, one
    level down, sorted by path. An unreadable or missing ``folder`` is an empty list."""
    folder = Path(folder).expanduser()
    found: list[ModelEntry] = []
    for seen, path in enumerate(_two_levels(folder)):
        if seen >= limit:
            break
        model = _model_at(path, folder)
        if model is not None:
            found.append(model)
    return found


def _two_levels(folder: Path) -> Iterator[Path]:
    """The entries of ``folder``, sorted, each followed by its own entries (sorted; none for a file)."""
    for entry in _entries(folder):
        yield entry
        yield from _entries(entry)


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:  # a file, or a folder that cannot be read
        return []


def _model_at(path: Path, root: Path) -> ModelEntry | None:
    name = str(path.relative_to(root))
    try:
        if path.suffix.lower() == ".gguf" and path.is_file():
            return ModelEntry(name, str(path), "gguf", _size(path))
        if path.is_dir() and (path / "config.json").is_file():
            return ModelEntry(name, str(path), "folder", _folder_size(path))
    except OSError:
        return None
    return None


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _folder_size(path: Path) -> int | None:
    total = 0
    try:
        for f in path.iterdir():
            if f.suffix.lower() in WEIGHT_SUFFIXES and f.is_file():
                total += f.stat().st_size
    except OSError:
        return None
    return total


# -- recent models ----------------------------------------------------------------------------------------


def recent_file(cache_dir: Path) -> Path:
    return Path(cache_dir) / RECENT_FILE


def read_recent(path: Path) -> list[tuple[str, str]]:
    """(spec, name) of the recent models, most recent first. A missing or damaged file is an empty list
    (it is a convenience, rewritten by the next switch)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        models = raw["models"]
        return [(str(m["spec"]), str(m["name"])) for m in models if isinstance(m, dict)][:RECENT_LIMIT]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the recent models file %s: %s", path, exc)
        return []


def record_recent(path: Path, spec: str, name: str) -> None:
    """Put ``spec`` first in the recent models file (atomically; at most ``RECENT_LIMIT`` kept). Paths are
    stored absolute. Raises OSError."""
    if looks_like_path(spec):
        spec = str(Path(spec).expanduser().resolve())
    key = model_key(spec)
    kept = [(s, n) for s, n in read_recent(path) if model_key(s) != key]
    models = [{"spec": s, "name": n} for s, n in [(spec, name), *kept][:RECENT_LIMIT]]
    atomic_write_text(Path(path), json.dumps({"version": 1, "models": models}, indent=2) + "\n")


def worth_recording(spec: str) -> bool:
    """Whether a loaded model goes into the recent list: a file, a folder or a hub id (bundled models are
    always listed anyway, and a served model's list is the server's)."""
    if bundled_model(spec) is not None:
        return False
    return Path(spec).expanduser().exists() if looks_like_path(spec) else True


def remember(cache_dir: Path, spec: str, name: str) -> None:
    """Record a model that loaded in the recent list, if it belongs there; a file that cannot be written
    is logged (the list is a convenience, never worth a failed load)."""
    if not worth_recording(spec):
        return
    try:
        record_recent(recent_file(cache_dir), spec, name)
    except OSError as exc:
        log.warning("cannot write the recent models file in %s: %s", cache_dir, exc)


def recent_entries(path: Path) -> list[ModelEntry]:
    out = []
    for spec, name in read_recent(path):
        if bundled_model(spec) is not None:
            continue
        p = Path(spec)
        if looks_like_path(spec):
            exists = p.exists()
            kind: Kind = "gguf" if p.suffix.lower() == ".gguf" else "folder"
            size = (_size(p) if kind == "gguf" else _folder_size(p)) if exists else None
            out.append(ModelEntry(name, spec, kind, size, recent=True, missing=not exists))
        else:
            out.append(ModelEntry(name, spec, "hub", None, recent=True))
    return out


def local_catalog(models_dir: Path, cache_dir: Path) -> list[ModelEntry]:
    """Every model the picker offers with the in-process engine: the recent ones first (most recent
    first), then the bundled ones, then those in ``models_dir``; each model once."""
    out: list[ModelEntry] = []
    keys: set[str] = set()
    for entry in [*recent_entries(recent_file(cache_dir)), *bundled_entries(), *scan_models_dir(models_dir)]:
        key = model_key(entry.spec)
        if key not in keys:
            keys.add(key)
            out.append(entry)
    return out


def served_catalog(names: list[str]) -> list[ModelEntry]:
    """A server's models (``--backend URL``): switching asks the same server for another one."""
    return [ModelEntry(n, n, "server") for n in names]
