"""A saved session comes back warm through the chat layer: ``SessionState.write`` stores its KV after
the file, a new engine over the same cache directory loads it, and the next turn's greedy output is the
same as without a reload. A KV store that cannot be written loses no session."""

from __future__ import annotations

import errno
import shutil

import pytest

from radixchat.chat.backend import kv_owner
from radixchat.chat.local import LocalBackend
from radixchat.chat.session import conversation_from_session, load_session
from radixchat.chat.session_state import SessionState
from radixchat.engine import Engine, EngineConfig, SamplingParams
from radixchat.engine.kvstore import files as files_module

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


def backend_for(smol, kv_dir) -> LocalBackend:
    return LocalBackend(Engine(smol[0], EngineConfig(kv_pool_tokens=4096, kv_store_dir=kv_dir, debug=True)))


async def first_turn(backend: LocalBackend, folder):
    """One turn of a new session, saved as 's' (file, then KV)."""
    conv = backend.new_conversation(system="You are a terse geography tutor.")
    conv.add_user("Name three long rivers in Europe, with one fact about each of them.")
    result = await backend.reply(conv, GREEDY).result()
    assert result.finish_reason == "length" and result.error is None  # the store never costs a reply
    state = SessionState(model=backend.model_name)
    return conv, state.write(state.session_file(conv, "s"), folder, backend, conv.ids)


async def second_turn(backend: LocalBackend, path, load: bool):
    conv = conversation_from_session(load_session(path), backend.fmt, backend.model_name)
    loaded = backend.load_kv(conv.ids) if load else None
    conv.add_user("Which of them is the longest?")
    return loaded, await backend.reply(conv, GREEDY).result()


async def test_a_reloaded_session_continues_exactly_as_without_a_reload(smol, tmp_path):
    kv_dir, folder = tmp_path / "kv", tmp_path / "sessions"
    a = backend_for(smol, kv_dir)
    await a.start()
    conv, saved = await first_turn(a, folder)
    await a.aclose()
    assert saved.kv is not None and saved.kv_notice is None
    assert saved.kv.tokens == len(conv.ids) - 1  # the last sampled token has no KV yet
    assert a.kv_usage()[kv_owner(saved.path)].tokens == saved.kv.tokens

    cold = backend_for(smol, None)  # no store: the history is prefilled again
    await cold.start()
    _, expected = await second_turn(cold, saved.path, load=False)
    await cold.aclose()
    assert expected.cached_tokens == 0

    warm = backend_for(smol, kv_dir)  # a new engine over the same cache directory
    await warm.start()
    loaded, result = await second_turn(warm, saved.path, load=True)
    stats = warm.stats()
    await warm.aclose()
    warm.engine.core.check_integrity()
    assert (loaded.cached_tokens, loaded.loaded_tokens, loaded.notices) == (0, saved.kv.tokens, ())
    assert result.cached_tokens == saved.kv.tokens  # only the new turn (and one token) is prefilled
    assert result.message.token_ids == expected.message.token_ids
    assert result.message.content == expected.message.content
    assert stats.kv_loaded_tokens == saved.kv.tokens
    assert any(n.from_disk for n in stats.tree)


@pytest.mark.parametrize("fault", ["full", "unwritable"])
async def test_a_kv_store_that_cannot_be_written_loses_no_session(smol, tmp_path, monkeypatch, fault):
    kv_dir, folder = tmp_path / "kv", tmp_path / "sessions"
    backend = backend_for(smol, kv_dir)
    await backend.start()
    if fault == "full":

        def full_disk(path, mode):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(files_module, "open", full_disk, raising=False)
    else:  # the store's directory was replaced by something nothing can be written under
        blocks = backend.engine.core.kv_tier.store.blocks_dir
        shutil.rmtree(blocks)
        blocks.write_text("not a directory")
    try:
        conv, saved = await first_turn(backend, folder)
    finally:
        monkeypatch.undo()
        await backend.aclose()
    session = load_session(saved.path)  # the session is saved, whole
    assert [m.token_ids or [] for m in session.messages] == [m.token_ids for m in conv.messages]
    assert saved.kv is not None and saved.kv.tokens == 0
    assert saved.kv_notice and "\n" not in saved.kv_notice


async def test_a_backend_without_a_store_saves_the_session_only(smol, tmp_path):
    backend = backend_for(smol, None)
    await backend.start()
    try:
        conv, saved = await first_turn(backend, tmp_path)
    finally:
        await backend.aclose()
    assert not backend.has_kv_store and saved.kv is None and saved.path.is_file()
    assert backend.kv_usage() == {} and backend.delete_kv(kv_owner(saved.path)) == 0
