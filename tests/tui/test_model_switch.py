"""``ChatCore.switch_model`` without Textual, between two tiny random models on the real engine: the
conversation carries over re-rendered with the new model's template, replies equal a fresh backend's,
a failed switch changes nothing, the old backend's memory is released, sessions record the new model."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from radixchat.chat.conversation import Conversation, Message
from radixchat.chat.loading import load_backend, settled_heap
from radixchat.chat.session import conversation_from_session, load_session, save_session
from radixchat.config import Settings
from radixchat.errors import ModelLoadError
from radixchat.tui.chat_core import ChatCore, ModelSwitchError
from tests.tui.model_folders import two_models


@pytest.fixture(scope="module")
def models(tmp_path_factory, smol_tokenizer):
    return two_models(tmp_path_factory.mktemp("models"), smol_tokenizer)


@pytest.fixture
def settings(models, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return Settings.load(
        {
            "model": str(models[0]),
            "models_dir": str(models[0].parent),
            "cache_dir": str(tmp_path / "cache"),
            "sessions_dir": str(tmp_path / "sessions"),
            "kv_pool_tokens": 4096,
            "temperature": 0.0,
            "max_tokens": 12,
            "repetition_penalty": 1.0,
        }
    )


async def started(settings: Settings):
    backend = await asyncio.to_thread(load_backend, settings)
    await backend.start()
    return backend


async def core_after_one_turn(settings: Settings) -> ChatCore:
    core = ChatCore(settings)
    core.adopt(await started(settings))
    core.state.reset(core.backend.new_conversation(system="Be brief."))
    core.state.conv.add_user("Hello there")
    await core.backend.reply(core.state.conv, core.params()).result()
    return core


def test_the_conversation_carries_over_and_replies_equal_a_fresh_backends(settings, models):
    async def run():
        core = await core_after_one_turn(settings)
        old = weakref.ref(core.backend)
        old_engine = weakref.ref(core.backend.engine)
        new = await core.switch_model(str(models[1]), load_backend)
        assert core.backend is new and new.model_name == "tiny-b" and core.state.model == "tiny-b"
        assert core.settings.model == str(models[1])
        gc.collect()
        assert old() is None and old_engine() is None  # closed, and nothing holds it (or its model)

        conv = core.state.conv
        assert conv.fmt is new.fmt and [m.token_ids for m in conv.messages] == [[], [], []]
        assert conv.messages[2].meta["model"] == "tiny-a"  # who wrote it
        conv.add_user("And then?")
        full = new.fmt.render(conv.active, add_generation_prompt=True)
        assert "### user:\nHello there" in full  # the new model's template
        assert conv.ids == new.fmt.encode(full)  # a fresh full rendering, not the old tokenizer's ids
        result = await new.reply(conv, core.params()).result()
        assert result.cached_tokens == 0  # the history is prefilled once...
        assert result.message.meta["model"] == "tiny-b"

        fresh = await started(settings.model_copy(update={"model": str(models[1])}))
        same = Conversation(fresh.fmt, messages=[Message(m.role, m.content) for m in conv.messages[:3]])
        same.add_user("And then?")
        expected = await fresh.reply(same, core.params()).result()
        assert same.ids[: -len(expected.message.token_ids)] == conv.ids[: -len(result.message.token_ids)]
        assert result.message.token_ids == expected.message.token_ids  # greedy, float32: equal
        assert result.message.content == expected.message.content
        await fresh.aclose()

        before = len(conv.ids)
        conv.add_user("Once more")
        again = await new.reply(conv, core.params()).result()
        assert again.cached_tokens == before - 1  # ...and later turns hit the cache
        await core.release().aclose()

    asyncio.run(run())


def test_the_old_model_is_released_under_a_settled_heap(settings, models):
    """The CLI freezes the heap after each load (``settled_heap``): the old model is frozen with it, and
    the switch thaws it to collect it."""

    async def run():
        with settled_heap():
            core = ChatCore(settings)
            core.adopt(await started(settings))
            core.state.reset(core.backend.new_conversation())
            old_model = weakref.ref(core.backend.engine.loaded.model)
            await core.switch_model(str(models[1]), load_backend)
            assert old_model() is None
            await core.release().aclose()

    asyncio.run(run())


@pytest.mark.parametrize("broken", ["corrupt", "missing"])
def test_a_failed_switch_keeps_the_model_and_the_conversation(settings, tmp_path, broken):
    target = tmp_path / "broken-model"
    if broken == "corrupt":
        target.mkdir()
        (target / "config.json").write_text("{not json")
    else:
        target = tmp_path / "gone.gguf"

    async def run():
        core = await core_after_one_turn(settings)
        backend, conv = core.backend, core.state.conv
        ids = list(conv.ids)
        with pytest.raises(ModelLoadError):
            await core.switch_model(str(target), load_backend)
        assert core.backend is backend and core.state.conv is conv and conv.ids == ids
        assert core.switching is None and core.settings.model == settings.model
        conv.add_user("Still there?")  # the old model still answers, from its cache
        result = await backend.reply(conv, core.params()).result()
        assert result.finish_reason in ("stop", "length") and result.cached_tokens == len(ids) - 1
        await core.release().aclose()

    asyncio.run(run())


def test_a_switch_needs_a_loaded_model_and_one_at_a_time(settings, models):
    async def run():
        core = ChatCore(settings)
        with pytest.raises(ModelSwitchError, match="not loaded"):
            await core.switch_model(str(models[1]), load_backend)
        core.adopt(await started(settings))
        core.state.reset(core.backend.new_conversation())
        first = asyncio.create_task(core.switch_model(str(models[1]), load_backend))
        await asyncio.sleep(0)
        assert core.switching == str(models[1]) and core.loading is not None
        with pytest.raises(ModelSwitchError, match="already switching"):
            await core.switch_model(str(models[0]), load_backend)
        await first
        assert core.loading is None
        await core.release().aclose()

    asyncio.run(run())


def test_a_session_saved_after_a_switch_records_the_new_model_and_loads_back(settings, models, tmp_path):
    async def run():
        core = await core_after_one_turn(settings)
        new = await core.switch_model(str(models[1]), load_backend)
        conv = core.state.conv
        conv.add_user("And then?")
        await new.reply(conv, core.params()).result()
        path = save_session(core.state.to_session("switched"), tmp_path / "switched.json")
        session = load_session(path)
        assert session.model == "tiny-b"
        assert [m.meta.get("model") for m in session.messages if m.role == "assistant"] == [
            "tiny-a",
            "tiny-b",
        ]
        back = conversation_from_session(session, new.fmt, new.model_name)
        assert [m.content for m in back.messages] == [m.content for m in conv.messages]
        back.add_user("Next")
        assert back.ids == new.fmt.encode(new.fmt.render(back.active, add_generation_prompt=True))
        await core.release().aclose()

    asyncio.run(run())
