"""What the model picker lists: bundled models, models_dir (bounded, two levels), recent models (a small
file written atomically, most recent first, missing ones marked)."""

from __future__ import annotations

import json
from pathlib import Path

from radixchat.bundled import BUNDLED
from radixchat.chat.model_catalog import (
    RECENT_LIMIT,
    local_catalog,
    model_key,
    read_recent,
    recent_file,
    record_recent,
    remember,
    scan_models_dir,
)


def folder_model(path: Path, weights: int = 10) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * weights)
    return path


def test_models_dir_lists_gguf_files_and_model_folders_two_levels_deep(tmp_path):
    root = tmp_path / "models"
    folder_model(root / "qwen")
    folder_model(root / "org" / "llama")
    (root / "org" / "notes.txt").write_text("not a model")
    (root / "a.gguf").write_bytes(b"\0" * 100)
    (root / "org" / "b.gguf").write_bytes(b"\0" * 7)
    folder_model(root / "deep" / "er" / "model")  # three levels: not looked at
    (root / "empty").mkdir()  # a folder without config.json is not a model
    found = scan_models_dir(root)
    assert [(e.name, e.kind, e.size) for e in found] == [
        ("a.gguf", "gguf", 100),
        ("org/b.gguf", "gguf", 7),
        ("org/llama", "folder", 12),  # config.json + weights
        ("qwen", "folder", 12),
    ]
    assert found[0].spec == str(root / "a.gguf")


def test_the_scan_is_bounded(tmp_path):
    root = tmp_path / "models"
    for i in range(30):
        (root / f"junk{i:02d}").mkdir(parents=True)
    (root / "zz.gguf").write_bytes(b"x")
    assert scan_models_dir(root, limit=10) == []
    assert [e.name for e in scan_models_dir(root, limit=31)] == ["zz.gguf"]


def test_a_missing_models_dir_is_an_empty_list(tmp_path):
    assert scan_models_dir(tmp_path / "nope") == []


def test_recent_models_are_written_atomically_most_recent_first(tmp_path):
    path = recent_file(tmp_path / "cache")
    a, b = folder_model(tmp_path / "a"), tmp_path / "b.gguf"
    b.write_bytes(b"gguf")
    record_recent(path, str(a), "a")
    record_recent(path, str(b), "b")
    record_recent(path, str(a), "a")  # again: moves to the front, once
    assert read_recent(path) == [(str(a), "a"), (str(b), "b")]
    assert json.loads(path.read_text())["version"] == 1
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind


def test_the_recent_list_keeps_the_newest_few(tmp_path):
    path = recent_file(tmp_path)
    for i in range(RECENT_LIMIT + 3):
        record_recent(path, str(tmp_path / f"m{i}.gguf"), f"m{i}")
    names = [n for _, n in read_recent(path)]
    assert names == [f"m{i}" for i in range(RECENT_LIMIT + 2, 2, -1)]


def test_a_damaged_recent_file_is_ignored(tmp_path):
    path = recent_file(tmp_path)
    path.write_text("{not json")
    assert read_recent(path) == []
    record_recent(path, str(tmp_path / "x.gguf"), "x")  # and the next record replaces it
    assert read_recent(path) == [(str(tmp_path / "x.gguf"), "x")]


def test_only_files_folders_and_hub_ids_are_remembered(tmp_path):
    model = folder_model(tmp_path / "m")
    for spec in ("smollm2", "fake-model", str(tmp_path / "gone"), str(model), "org/name"):
        remember(tmp_path, spec, spec)
    assert [s for s, _ in read_recent(recent_file(tmp_path))] == ["org/name", str(model)]


def test_the_catalog_lists_recent_then_bundled_then_models_dir_each_once(tmp_path):
    models, cache = tmp_path / "models", tmp_path / "cache"
    kept = folder_model(models / "kept")
    folder_model(models / "other")
    gone = folder_model(tmp_path / "gone")
    record_recent(recent_file(cache), str(gone), "gone")
    record_recent(recent_file(cache), str(kept), "kept")
    gone.joinpath("config.json").unlink()
    gone.joinpath("model.safetensors").unlink()
    gone.rmdir()
    rows = [(e.name, e.kind, e.recent, e.missing) for e in local_catalog(models, cache)]
    assert rows == [
        ("kept", "folder", True, False),
        ("gone", "folder", True, True),  # marked, not dropped
        *[(b.name, "bundled", False, False) for b in BUNDLED if b.size() is not None],
        ("other", "folder", False, False),  # "kept" is listed once, as recent
    ]


def test_model_keys_compare_spellings_of_one_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder_model(tmp_path / "m")
    assert model_key("SmolLM2") == model_key("default") == "smollm2"
    assert model_key("m") == model_key(str(tmp_path / "m")) == model_key("./m/")
    assert model_key("org/name") == "org/name"
