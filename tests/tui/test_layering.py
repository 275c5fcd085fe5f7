"""The app's layering: no torch in the UI process until the backend loads it, and files stay small."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import radixchat.tui

TUI = Path(radixchat.tui.__file__).parent


def test_importing_the_app_does_not_import_torch():
    code = "import sys, radixchat.tui.app; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_tui_module_imports_torch_directly():
    for path in TUI.rglob("*.py"):
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path


def test_modules_stay_small_and_each_screen_has_its_stylesheet():
    for path in TUI.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path
    for path in (TUI / "screens").glob("*.py"):
        if path.name != "__init__.py":
            assert path.with_suffix(".tcss").exists(), path
