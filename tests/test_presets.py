"""Named presets: ``[presets.NAME]`` tables of the config file, chosen with ``--preset NAME``."""

from __future__ import annotations

import os

import pytest

from radixchat import cli
from radixchat.config import Settings
from radixchat.errors import ConfigError
from radixchat.exit_codes import ExitCode

CONFIG = """
temperature = 0.5
max_tokens = 100
system_prompt = "You are helpful."

[presets.code]
description = "Terse coding help"
system_prompt = "You write Python."
temperature = 0.0
top_k = 1
mode = "chat"

[presets.facts]
mode = "json"
max_tokens = 64
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith("RADIXCHAT_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    return path


def test_presets_are_read_from_the_config_file_and_change_nothing_unless_chosen(config):
    s = Settings.load(config_file=config)
    assert sorted(s.presets) == ["code", "facts"]
    assert s.presets["code"].description == "Terse coding help" and s.presets["facts"].mode == "json"
    assert (s.preset, s.temperature, s.max_tokens, s.system_prompt) == (None, 0.5, 100, "You are helpful.")


def test_a_chosen_preset_lays_its_settings_over_the_config_file(config):
    s = Settings.load({"preset": "code"}, config_file=config)
    assert (s.temperature, s.top_k, s.system_prompt) == (0.0, 1, "You write Python.")
    assert s.max_tokens == 100  # not in the preset: the file's


def test_flags_win_over_the_preset(config):
    s = Settings.load({"preset": "code", "temperature": "0.7"}, config_file=config)
    assert (s.temperature, s.top_k) == (0.7, 1)


def test_the_preset_wins_over_the_environment(config, monkeypatch):
    monkeypatch.setenv("RADIXCHAT_TOP_K", "9")
    assert Settings.load({"preset": "code"}, config_file=config).top_k == 1


def test_the_config_file_can_choose_a_preset(config):
    config.write_text('preset = "facts"\n' + CONFIG)
    assert Settings.load(config_file=config).max_tokens == 64


def test_an_unknown_preset_names_the_presets_there_are(config):
    with pytest.raises(ConfigError, match=r"^unknown preset 'cod' \(presets: code, facts\)$"):
        Settings.load({"preset": "cod"}, config_file=config)
    with pytest.raises(ConfigError, match=r"unknown preset 'code' \(presets: none in the config file\)"):
        Settings.load({"preset": "code"})


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            "temperature = 9.0",
            r"invalid field 'temperature' in \[presets.bad\] in .*c.toml: .*less than or equal to 5",
        ),
        ('mode = "poem"', r"invalid field 'mode' in \[presets.bad\]"),
        ("temprature = 0.1", r"unknown field 'temprature' in \[presets.bad\] in .*c.toml"),
        ("max_tokens = 0", r"invalid field 'max_tokens' in \[presets.bad\]"),
        ('stop = [""]', r"invalid field 'stop.0' in \[presets.bad\]"),
    ],
)
def test_a_bad_preset_table_is_one_line_naming_the_table_and_field(tmp_path, table, message):
    path = tmp_path / "c.toml"
    path.write_text(f"[presets.bad]\n{table}\n")
    with pytest.raises(ConfigError, match=message) as info:
        Settings.load(config_file=path)
    assert "\n" not in str(info.value)


def test_cli_unknown_preset_is_a_usage_error_of_one_line(config, capsys, monkeypatch):
    monkeypatch.setattr("radixchat.tui.app.run_app", lambda *a, **k: pytest.fail("the app started"))
    assert cli.main(["--config", str(config), "--preset", "nope"]) == ExitCode.USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["radixchat: unknown preset 'nope' (presets: code, facts)"]


def test_cli_preset_reaches_the_app(config, monkeypatch):
    seen: list[Settings] = []

    def run_app(settings, session=None, backend_factory=None) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr("radixchat.tui.app.run_app", run_app)
    assert cli.main(["--config", str(config), "--preset", "code", "--top-k", "4"]) == 0
    (s,) = seen
    assert (s.preset, s.temperature, s.top_k) == ("code", 0.0, 4)


def test_help_lists_the_preset_flag(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "--preset" in out and "-c, --continue" in out


def test_stop_sequences_come_from_the_config_file_or_the_preset(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('stop = ["###"]\n[presets.dialogue]\nstop = ["User:", "\\n\\n"]\n')
    assert Settings.load(config_file=path).stop == ["###"]
    assert Settings.load({"preset": "dialogue"}, config_file=path).stop == ["User:", "\n\n"]
