"""The model switch through the UI: F7's picker (snapshot), choosing a model, the divider and footers, a
switch refused mid-reply, a failed one, a message sent while the new model loads, and the whole thing on
the real engine between two tiny models."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from radixchat.bundled import SMOLLM2
from radixchat.chat.loading import load_backend
from radixchat.chat.model_catalog import read_recent, recent_file, record_recent
from radixchat.chat.session import SessionFile, load_session, session_path
from radixchat.config import Settings
from radixchat.errors import ModelLoadError
from radixchat.tui.app import RadixChatApp
from radixchat.tui.screens.dialogs import ConfirmDialog
from radixchat.tui.screens.models import ModelsScreen
from radixchat.tui.widgets.note import Note
from tests.tui.conftest import TERMINAL, FakeBackend, Script, ready, say, say_mid_reply, turn_done, wait_until
from tests.tui.model_folders import two_models


def fixed_folder(path: Path, size: int) -> Path:
    """A folder the picker lists as a model (it does not load it): fixed sizes for the snapshot."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * (size - 2))
    return path


class OtherFake(FakeBackend):
    model_name = "other-model"


def switching_app(settings, fakes: dict[str, FakeBackend], **kwargs) -> RadixChatApp:
    """An app whose backend factory gives the fake its ``model`` setting names (an unknown name fails
    as a bad model file does)."""

    def factory(s: Settings, progress) -> FakeBackend:
        if s.model not in fakes:
            raise ModelLoadError(f"model '{s.model}' not found: not a directory, a .gguf file, or a hub id")
        return fakes[s.model]

    return RadixChatApp(settings, backend_factory=factory, panel_interval=None, **kwargs)


def notes(app: RadixChatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


def dividers(app: RadixChatApp) -> list[str]:
    return [str(n.render()) for n in app.chat.transcript.query(Note) if n.has_class("switch")]


def test_the_model_picker(snap_compare, settings, tui_env, monkeypatch):
    # relative folders, a fixed recent list and the default model alone of the bundled ones (whether the
    # test command installed Gemma's packages is not the picker's concern): the same picture on every machine
    monkeypatch.chdir(tui_env)
    monkeypatch.setattr("radixchat.chat.model_catalog.BUNDLED", (SMOLLM2,))
    fixed_folder(tui_env / "models" / "Qwen2.5-0.5B-Instruct", 988 * 2**20)
    fixed_folder(tui_env / "models" / "HuggingFaceTB" / "SmolLM2-360M-Instruct", 724 * 2**20)
    (tui_env / "models" / "gemma-3-270m-q4_k_m.gguf").write_bytes(b"\0" * (241 * 2**20))
    cache = tui_env / "cache"
    record_recent(recent_file(cache), "/gone/old-model", "old-model")
    record_recent(recent_file(cache), "Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B")
    settings = settings.model_copy(
        update={"models_dir": Path("models"), "cache_dir": cache, "model": "smollm2"}
    )

    async def run_before(pilot) -> None:
        app = pilot.app
        await ready(app, pilot)
        await pilot.press("f7")
        await wait_until(lambda: getattr(app.screen, "loaded", False), pilot=pilot)
        await pilot.pause()

    app = switching_app(settings, {settings.model: FakeBackend()}, session="demo")
    assert snap_compare(app, terminal_size=(130, 40), run_before=run_before)


async def test_f7_switches_and_the_chat_carries_over(settings, tui_env):
    fixed_folder(tui_env / "models" / "other-model", 10)
    other = str(tui_env / "models" / "other-model")
    settings = settings.model_copy(update={"models_dir": tui_env / "models", "cache_dir": tui_env / "cache"})
    first, second = FakeBackend(), OtherFake(Script(reply_for=lambda p: "From the other model."))
    app = switching_app(settings, {"fake-model": first, other: second})
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "Hello")
        await pilot.press("f7")
        await wait_until(lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded, pilot=pilot)
        assert [e.name for e in app.screen.shown][-1] == "other-model"
        await pilot.press(*"other")  # the filter
        assert [e.name for e in app.screen.shown] == ["other-model"]
        await pilot.press("enter")
        await wait_until(lambda: app.backend is second, pilot=pilot)
        await wait_until(lambda: "Switched to other-model" in notes(app), pilot=pilot)
        assert getattr(first, "closed", False)  # the old backend was closed
        assert dividers(app) == ["─── switched to other-model ───"]
        assert str(app.query_one("StatusBar .info").render()).startswith("other-model · ")
        conv = app.chat.state.conv
        assert conv.fmt is second.fmt and [m.content for m in conv.messages] == [
            "Hello",
            "You said: **Hello**",
        ]
        assert read_recent(recent_file(tui_env / "cache"))[0] == (other, "other-model")

        await say(app, pilot, "Again")
        assert app.chat.state.conv.messages[-1].content == "From the other model."
        assert second.script.replies == ["Again"]
        saved = load_session(session_path(settings.sessions_dir, app.chat.state.session_name))
        assert saved.model == "other-model"


async def test_a_switch_is_refused_mid_reply(settings, fake):
    other = OtherFake()
    app = switching_app(settings, {"fake-model": fake, "other": other})
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say_mid_reply(app, pilot, fake, "Long one")
        assert not await app.models.switch("other")
        await wait_until(lambda: any("stop it (Esc)" in n for n in notes(app)), pilot=pilot)
        assert app.backend is fake
        fake.script.gate.set()
        await turn_done(app, pilot, 0)


async def test_a_model_that_fails_to_load_leaves_the_chat_as_it_was(settings, fake):
    app = switching_app(settings, {"fake-model": fake})
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "Hello")
        ids = list(app.chat.state.conv.ids)
        assert not await app.models.switch("/no/such/model.gguf")
        assert app.backend is fake and app.chat.state.conv.ids == ids and not dividers(app)
        await wait_until(lambda: any("'/no/such/model.gguf' not found" in n for n in notes(app)), pilot=pilot)
        assert app.chat.core.loading is None


async def test_a_message_sent_while_the_new_model_loads_goes_to_it(settings, fake):
    gate = threading.Event()
    other = OtherFake(Script(reply_for=lambda p: "New model here."))

    def factory(s: Settings, progress) -> FakeBackend:
        if s.model == "other":
            progress("loading other on cpu")
            gate.wait(10)
            return other
        return fake

    app = RadixChatApp(settings, backend_factory=factory, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.run_worker(app.models.switch("other"))
        await wait_until(lambda: app.chat.core.loading == "loading other on cpu", pilot=pilot)
        assert str(app.query_one("StatusBar .activity").render()) == "loading other on cpu"
        await pilot.press("f7")  # one switch at a time
        await wait_until(lambda: "Not now: loading other on cpu" in notes(app), pilot=pilot)
        assert not isinstance(app.screen, ModelsScreen)
        await say(app, pilot, "Who is there?", wait=False)
        assert app.chat.turns.queued == "Who is there?" and fake.script.replies == []
        gate.set()
        await turn_done(app, pilot, 0)
        assert other.script.replies == ["Who is there?"] and app.backend is other


@pytest.mark.real_model
async def test_switching_between_two_real_models_through_the_ui(tui_env, smol_tokenizer):
    a, b = two_models(tui_env / "models", smol_tokenizer)
    settings = Settings.load(
        {
            "model": str(a),
            "models_dir": str(tui_env / "models"),
            "cache_dir": str(tui_env / "cache"),
            "sessions_dir": str(tui_env / "sessions"),
            "kv_pool_tokens": 4096,
            "temperature": 0,
            "max_tokens": 8,
        }
    )
    app = RadixChatApp(settings, backend_factory=load_backend, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "Hello")
        await pilot.press("f7")
        await wait_until(lambda: isinstance(app.screen, ModelsScreen) and app.screen.loaded, pilot=pilot)
        await pilot.press(*"tiny-b", "enter")
        await wait_until(lambda: app.backend is not None and app.backend.model_name == "tiny-b", pilot=pilot)
        await wait_until(lambda: dividers(app) == ["─── switched to tiny-b ───"], pilot=pilot)
        await say(app, pilot, "And now?")
        footers = [
            str(v.query_one(".footer").render()) for v in app.chat.transcript.query("AssistantMessage")
        ]
        assert footers[0].endswith(" · tiny-a") and footers[1].endswith(" · tiny-b")
        assert footers[1].startswith("reused 0 · ")  # the carried-over history was prefilled once
        # shown again (a branch switch, a reopened session): the divider comes from the replies' models
        await app.chat.transcript.show(app.chat.state.conv.messages)
        assert dividers(app) == ["─── switched to tiny-b ───"]
        path = session_path(settings.sessions_dir, app.chat.state.session_name)
        assert json.loads(path.read_text())["model"] == "tiny-b"
        assert [s for s, _ in read_recent(recent_file(tui_env / "cache"))] == [str(b), str(a)]


async def test_a_session_saved_with_a_known_model_offers_to_switch_to_it(settings, tui_env, fake):
    fixed_folder(tui_env / "models" / "other-model", 10)
    other_spec = str(tui_env / "models" / "other-model")
    settings = settings.model_copy(update={"models_dir": tui_env / "models", "cache_dir": tui_env / "cache"})
    session = SessionFile(
        name="old",
        model="other-model",
        messages=[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}],
    )
    other = OtherFake()
    app = switching_app(settings, {"fake-model": fake, other_spec: other}, session=session)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await wait_until(lambda: isinstance(app.screen, ConfirmDialog), pilot=pilot)
        assert app.screen.question == "This session was saved with other-model. Switch to it?"
        await pilot.press("y")
        await wait_until(lambda: app.backend is other, pilot=pilot)
        assert [m.content for m in app.chat.state.conv.messages] == ["hello", "hi there"]
        assert app.chat.state.conv.fmt is other.fmt
