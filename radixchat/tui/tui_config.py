"""The app's own settings file, ``$XDG_CONFIG_HOME/radixchat/tui.toml``: theme and keymap.

```toml
theme = "nord"
[keymap]
"mode.cycle" = "f5"       # binding id = keys (comma-separated)
```
``Settings`` (config.toml) forbids unknown keys, so these live beside it until it grows fields for them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from radixchat.config import default_config_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(slots=True)
class TuiConfig:
    theme: str | None = None
    keymap: dict[str, str] = field(default_factory=dict)
    problem: str | None = None  # why the file was ignored, to show once


def default_tui_config_file() -> Path:
    return default_config_file().parent / "tui.toml"


def load_tui_config(path: Path | None = None) -> TuiConfig:
    path = path or default_tui_config_file()
    if not path.is_file():
        return TuiConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return TuiConfig(problem=f"{path} ignored: {exc}")
    theme = data.get("theme")
    keymap = data.get("keymap", {})
    if not isinstance(keymap, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in keymap.items()
    ):
        return TuiConfig(problem=f"{path} ignored: [keymap] maps binding ids to key strings")
    return TuiConfig(theme if isinstance(theme, str) else None, dict(keymap))
