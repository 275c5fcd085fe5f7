"""Settings precedence and error messages."""

from __future__ import annotations

import pytest

from radixchat.config import Settings
from radixchat.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for key in list(__import__("os").environ):
        if key.startswith("RADIXCHAT_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))


def test_defaults():
    s = Settings.load()
    assert s.model == "smollm2" and s.device == "auto" and s.schedule_policy == "lpm" and s.radix_cache


def test_settings_can_be_built_directly(monkeypatch):
    """Library users write ``Settings(...)``: env vars apply, no config file is read."""
    monkeypatch.setenv("RADIXCHAT_TOP_K", "5")
    s = Settings(max_tokens=9)
    assert (s.max_tokens, s.top_k, s.model) == (9, 5, "smollm2")


def test_precedence_defaults_file_env_flags(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('max_tokens = 100\ntemperature = 0.5\ntop_k = 7\nschedule_policy = "fcfs"\n')
    s = Settings.load(config_file=cfg)
    assert (s.max_tokens, s.temperature, s.top_k, s.schedule_policy) == (100, 0.5, 7, "fcfs")
    monkeypatch.setenv("RADIXCHAT_TEMPERATURE", "0.9")
    monkeypatch.setenv("RADIXCHAT_TOP_K", "3")
    s = Settings.load(config_file=cfg)
    assert (s.max_tokens, s.temperature, s.top_k) == (100, 0.9, 3)
    s = Settings.load({"top_k": "1"}, config_file=cfg)
    assert (s.max_tokens, s.temperature, s.top_k) == (100, 0.9, 1)


def test_default_config_file_location_is_read(tmp_path):
    path = tmp_path / "xdg" / "radixchat" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text("max_running_requests = 4\n")
    assert Settings.load().max_running_requests == 4


def test_invalid_value_names_the_setting(monkeypatch):
    monkeypatch.setenv("RADIXCHAT_DEVICE", "tpu")
    with pytest.raises(ConfigError, match=r"invalid setting 'device'.*RADIXCHAT_DEVICE"):
        Settings.load()


def test_out_of_range_flag_names_the_flag():
    with pytest.raises(ConfigError, match=r"invalid setting 'top_p'.*--top-p"):
        Settings.load({"top_p": "1.5"})


def test_unknown_key_in_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("tempurature = 0.3\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'tempurature' in .*c.toml"):
        Settings.load(config_file=cfg)


def test_broken_toml_is_reported_with_the_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("max_tokens = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.load(config_file=cfg)


def test_missing_explicit_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        Settings.load(config_file=tmp_path / "nope.toml")


def test_kv_store_settings_reach_the_engine(tmp_path, monkeypatch):
    from radixchat.chat.engine_settings import engine_config
    from radixchat.cli import build_parser, settings_from_args

    monkeypatch.delenv("RADIXCHAT_KV_STORE", raising=False)  # tests/conftest.py turns it off
    on = engine_config(Settings.load({"cache_dir": str(tmp_path)}))
    assert (on.kv_store_dir, on.kv_store_bytes) == (tmp_path / "kv", 2 << 30)
    monkeypatch.setenv("RADIXCHAT_KV_STORE_GIB", "0.5")
    assert engine_config(Settings.load()).kv_store_bytes == 1 << 29
    assert on.kv_spill
    args = build_parser().parse_args(["--no-kv-store", "--no-kv-spill", "--kv-store-gib", "3"])
    off = engine_config(settings_from_args(args))
    assert (off.kv_store_dir, off.kv_spill, off.kv_store_bytes) == (None, False, 3 << 30)
    with pytest.raises(ConfigError, match=r"invalid setting 'kv_store_gib'.*--kv-store-gib"):
        Settings.load({"kv_store_gib": "0"})


def test_the_help_renders_every_setting():
    """argparse formats each flag's help with %: every setting's description must survive it."""
    from radixchat.cli import build_parser

    text = build_parser().format_help()  # raised TypeError once, for a description's "5%"
    assert "--code-prefetch {auto,off}" in text and "--kv-dtype" in text
