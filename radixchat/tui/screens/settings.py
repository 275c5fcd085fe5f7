"""Per-session settings: the system prompt, sampling parameters and stop sequences (blank = the app's
default); with presets in the config file, a choice of one fills the fields in (and, applied, sets its mode
and tools too)."""

from __future__ import annotations

import json
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from radixchat.chat.session import SamplingSettings
from radixchat.config import Preset
from radixchat.tui.widgets.ordered_keys import OrderedInput, OrderedTextArea

# name -> (label, type, lower bound, upper bound, lower bound exclusive)
FIELDS: dict[str, tuple[str, type, float | None, float | None, bool]] = {
    "temperature": ("temperature", float, 0.0, 5.0, False),
    "top_p": ("top p", float, 0.0, 1.0, True),
    "top_k": ("top k", int, 0, None, False),
    "repetition_penalty": ("repetition penalty", float, 0.01, 5.0, False),  # as the engine allows
    "max_tokens": ("max tokens", int, 1, None, False),
    "seed": ("seed", int, 0, 2**63 - 1, False),  # as the config file's (torch takes a 64-bit seed)
}


def parse_field(name: str, raw: str) -> Any:
    """The value of one field (None when blank); raises ValueError with a message naming the field."""
    label, kind, lo, hi, lo_open = FIELDS[name]
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{label}: '{raw}' is not {'an integer' if kind is int else 'a number'}") from None
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError(f"{label} must be {'>' if lo_open else '≥'} {lo}")
    if hi is not None and value > hi:
        raise ValueError(f"{label} must be ≤ {hi}")
    return value


def parse_stop(raw: str) -> list[str] | None:
    """Stop sequences as a JSON list of strings (JSON, so a newline or a comma can be one); None when
    blank. Raises ValueError with a message naming the field."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise ValueError('stop sequences: a JSON list of non-empty strings, e.g. ["\\n\\n", "User:"]')
    return value


def stop_text(stop: list[str] | None) -> str:
    return "" if stop is None else json.dumps(stop, ensure_ascii=False)


def placeholder(name: str, default: Any) -> str:
    """What a blank field means, as ``radixchat --help`` says it (no seed: a random one)."""
    return f"default {'random' if name == 'seed' and default is None else default}"


class SettingsScreen(ModalScreen[tuple[str | None, SamplingSettings, str | None] | None]):
    """Dismisses with (system prompt, sampling, the preset chosen or None), or None."""

    CSS_PATH = "settings.tcss"
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="settings.cancel"),
        # Not a priority binding: it must act after the keys typed before it (widgets/ordered_keys.py).
        Binding("ctrl+s", "save", "Apply", id="settings.apply"),
    ]

    def __init__(
        self,
        system_prompt: str | None,
        sampling: SamplingSettings,
        defaults: dict[str, Any],
        presets: dict[str, Preset] | None = None,
    ) -> None:
        super().__init__()
        self.system_prompt = system_prompt
        self.sampling = sampling
        self.defaults = defaults
        self.presets = presets or {}
        self.preset: str | None = None  # the one chosen here

    def compose(self) -> ComposeResult:
        with Vertical(id="settings"):
            yield Static("Session settings", id="settings-title")
            with VerticalScroll():
                if self.presets:
                    yield Label("Preset (fills the fields in; applying it also sets its mode and tools)")
                    yield Select(
                        [(name, name) for name in sorted(self.presets)],
                        prompt="none",
                        id="preset",
                    )
                yield Label("System prompt (changing it on a started chat starts a new branch)")
                yield OrderedTextArea(self.system_prompt or "", id="system-prompt", soft_wrap=True)
                with Grid(id="sampling"):
                    for name, (label, *_rest) in FIELDS.items():
                        yield Label(label)
                        value = getattr(self.sampling, name)
                        yield OrderedInput(
                            "" if value is None else str(value),
                            placeholder=placeholder(name, self.defaults.get(name)),
                            id=f"f-{name}",
                        )
                    yield Label("stop sequences")
                    default_stop = stop_text(self.defaults.get("stop") or None) or "none"
                    yield OrderedInput(
                        stop_text(self.sampling.stop),
                        placeholder=f'default {default_stop} · a JSON list, e.g. ["\\n\\n", "User:"]',
                        id="f-stop",
                    )
            yield Static("", id="settings-error", markup=False)
            yield Static(
                "Blank fields use the defaults from the config file · Ctrl+S applies · Esc cancels",
                id="settings-hint",
            )
            with Horizontal(classes="buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#system-prompt", TextArea).focus()

    def on_select_changed(self, event: Select.Changed) -> None:
        preset = self.presets.get(event.value) if isinstance(event.value, str) else None
        self.preset = event.value if preset is not None else None
        if preset is None:
            return
        if preset.system_prompt is not None:
            self.query_one("#system-prompt", TextArea).load_text(preset.system_prompt)
        for name in FIELDS:
            value = getattr(preset, name)
            self.query_one(f"#f-{name}", Input).value = "" if value is None else str(value)
        self.query_one("#f-stop", Input).value = stop_text(preset.stop)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "apply":
            self.action_save()
        else:
            self.dismiss(None)

    def action_save(self) -> None:
        values: dict[str, Any] = {}
        try:
            for name in FIELDS:
                values[name] = parse_field(name, self.query_one(f"#f-{name}", Input).value)
            values["stop"] = parse_stop(self.query_one("#f-stop", Input).value)
        except ValueError as exc:
            self.query_one("#settings-error", Static).update(str(exc))
            return
        system = self.query_one("#system-prompt", TextArea).text.strip() or None
        self.dismiss((system, SamplingSettings(**values), self.preset))

    def action_cancel(self) -> None:
        self.dismiss(None)
