"""The real engine (SmolLM2 on CPU) end to end through the UI: stream, reuse, panels, branch, stop, quit."""

from __future__ import annotations

import json

import pytest

from radixchat.chat.local import LocalBackend
from radixchat.config import Settings
from radixchat.engine import Engine, EngineConfig
from radixchat.tui.app import RadixChatApp
from radixchat.tui.widgets.cache_tree import CacheTree
from radixchat.tui.widgets.tool_call import ToolCallBlock
from tests.tui.conftest import TERMINAL, ready, say, turn_done, wait_until

pytestmark = pytest.mark.real_model


async def test_the_real_engine_streams_reuses_the_cache_and_stops(smol, tui_env):
    settings = Settings.load({"sessions_dir": str(tui_env / "sessions"), "temperature": 0, "max_tokens": 12})
    made: list[LocalBackend] = []

    def factory(s: Settings, progress) -> LocalBackend:
        progress("loading the test model")
        made.append(LocalBackend(Engine(smol[0], EngineConfig(kv_pool_tokens=4096, debug=True))))
        return made[0]

    app = RadixChatApp(settings, backend_factory=factory, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        assert made[0].engine.running

        await say(app, pilot, "What is the capital of France?")
        first = app.chat.state.conv.messages[-1]
        view = app.chat.transcript.last_assistant()
        assert first.content and "".join(view.streamed) == first.content
        assert len(view.streamed) > 1
        footer = str(view.query_one(".footer").render())
        assert footer.startswith("reused 0 · prefilled ") and "TTFT" in footer and "tok/s" in footer

        await say(app, pilot, "And of Spain?")
        usage = app.chat.state.conv.messages[-1].meta["usage"]
        turn_one = sum(len(m.token_ids) for m in app.chat.state.conv.messages[:2])
        assert usage["cached_tokens"] >= turn_one - 1  # the whole first turn came from the radix tree

        await app.chat.refresh_panels_now()
        tree = app.query_one(CacheTree)
        path = made[0].cached_path(app.chat.state.conv.ids)
        assert len(path) >= 2 and set(path) <= tree.drawn_ids
        assert "KV pool" in str(app.query_one("#memory").render())

        # regenerate: a branch whose prompt is entirely cached
        await pilot.press("ctrl+r")
        await turn_done(app, pilot, 2)
        assert len(app.chat.state.branches) == 2
        regen = app.chat.state.conv.messages[-1].meta["usage"]
        assert regen["cached_tokens"] == regen["prompt_tokens"] - 1

        # Esc stops a long reply at once and keeps its text
        app.chat.state.sampling = app.chat.state.sampling.model_copy(update={"max_tokens": 400})
        await say(app, pilot, "Count from 1 to 200, one number per line.", wait=False)
        await wait_until(
            lambda: app.chat.reply_view is not None and len(app.chat.reply_view.streamed) >= 2,
            pilot=pilot,
            timeout=30,
        )
        await pilot.press("escape")
        await turn_done(app, pilot, 3)
        stopped = app.chat.state.conv.messages[-1]
        assert stopped.finish_reason == "cancelled" and stopped.content
        assert stopped.meta["usage"]["completion_tokens"] < 100
        await pilot.press("ctrl+q")
    assert not made[0].engine.running
    made[0].engine.core.check_integrity()


async def test_json_mode_on_the_real_engine_shows_schema_valid_pretty_json(smol, tui_env):
    """Runs where the grammar layer is in (``grammar_for`` gives a matcher); skipped before that."""
    settings = Settings.load({"sessions_dir": str(tui_env / "sessions"), "temperature": 0, "max_tokens": 60})
    backend = LocalBackend(Engine(smol[0], EngineConfig(kv_pool_tokens=4096)))
    app = RadixChatApp(settings, backend_factory=lambda s, p: backend, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.state.schema = {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        }
        await app.chat.action_set_mode("json")
        if app.chat.mode_problem:
            await pilot.press("ctrl+q")
            pytest.skip(f"JSON mode is not available yet: {app.chat.mode_problem}")
        await say(app, pilot, "Describe a person as JSON.")
        view = app.chat.transcript.last_assistant()
        value = json.loads(view.message.content)
        assert set(value) >= {"name", "age"} and isinstance(value["age"], int)
        assert view.body.source.startswith("```json\n{\n  ")
        await pilot.press("ctrl+q")


async def test_a_tool_call_on_the_real_engine_runs_the_calculator(smol, tui_env):
    """SmolLM2, greedy, tool_choice naming the calculator: the grammar makes the first reply a call of it;
    the call runs and the model answers in the one round it has left."""
    settings = Settings.load(
        {"sessions_dir": str(tui_env / "sessions"), "temperature": 0, "max_tokens": 40, "max_tool_rounds": 1}
    )
    backend = LocalBackend(Engine(smol[0], EngineConfig(kv_pool_tokens=4096)))
    app = RadixChatApp(settings, backend_factory=lambda s, p: backend, panel_interval=None)
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        app.chat.state.tool_choice = {"name": "calculator"}
        await app.chat.action_set_mode("tool")
        assert app.chat.mode_problem is None
        await say(
            app,
            pilot,
            "What is 12 times 7? Use the calculator.",
        )
        conv = app.chat.state.conv
        assert [m.role for m in conv.messages] == ["user", "assistant", "tool", "assistant"]
        (call,) = conv.messages[1].tool_calls
        assert call["name"] == "calculator" and isinstance(call["arguments"]["expression"], str)
        block = app.query_one(ToolCallBlock)
        assert block.has_class("-ok") or block.has_class("-error")  # whatever it wrote, the call ran
        assert block_title_ok(block)
        final = app.chat.transcript.last_assistant()
        assert "<tool_call>" not in final.body.source and final.message.finish_reason in ("stop", "length")
        # the answer's round reused everything before the tool result
        usage = conv.messages[-1].meta["usage"]
        assert usage["cached_tokens"] >= len(conv.messages[0].token_ids) + len(conv.messages[1].token_ids) - 1
        await pilot.press("ctrl+q")


def block_title_ok(block: ToolCallBlock) -> bool:
    return str(block.title).split(" ", 1)[1].startswith("calculator(expression=")


async def test_a_schema_with_unenforceable_keywords_asks_and_runs_leniently(smol, tui_env):
    """Strict refuses uniqueItems; the app asks, and once the user agrees it runs the schema leniently,
    shows which keywords are not enforced, and checks the reply against the whole schema."""
    from radixchat.tui.screens.dialogs import ConfirmDialog

    settings = Settings.load({"sessions_dir": str(tui_env / "sessions"), "temperature": 0, "max_tokens": 24})
    backend = LocalBackend(Engine(smol[0], EngineConfig(kv_pool_tokens=4096)))
    app = RadixChatApp(settings, backend_factory=lambda s, p: backend, panel_interval=None)
    notices: list[tuple[str, str]] = []
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        shown = app.notify
        app.notify = lambda message, **kw: (
            notices.append((kw.get("title", ""), message)),
            shown(message, **kw),
        )
        app.chat.state.schema = {
            "type": "array",
            "items": {"type": "integer"},
            "uniqueItems": True,
            "maxItems": 3,
        }
        await app.chat.action_set_mode("json")
        await wait_until(lambda: isinstance(app.screen, ConfirmDialog), pilot=pilot, timeout=10)
        await pilot.press("y")
        await wait_until(
            lambda: app.chat.state.lenient and app.chat.mode_problem is None, pilot=pilot, timeout=30
        )
        await wait_until(lambda: any(t == "Lenient JSON mode" for t, _ in notices), pilot=pilot, timeout=10)
        assert any("uniqueItems at #" in m for t, m in notices if t == "Lenient JSON mode")
        await say(app, pilot, "Three numbers as a JSON array.")
        items = json.loads(app.chat.transcript.last_assistant().message.content)
        assert isinstance(items, list) and all(isinstance(i, int) for i in items)
        broke = any(t == "The reply breaks the schema" for t, _ in notices)
        assert broke == (len(set(items)) != len(items))
        await pilot.press("ctrl+q")


async def test_a_reopened_session_comes_back_warm_from_disk_and_replies_the_same(smol, tui_env):
    """Two app runs over one KV store directory (as two launches of radixchat): the second opens the
    session saved by the first, loads its KV instead of prefilling, marks those nodes in the cache tree,
    and its greedy reply equals an app run with no store at all."""
    from radixchat.chat.session import load_session, session_path

    settings = Settings.load({"sessions_dir": str(tui_env / "sessions"), "temperature": 0, "max_tokens": 12})

    def app_with(kv_dir, session):
        engine = Engine(smol[0], EngineConfig(kv_pool_tokens=4096, kv_store_dir=kv_dir, debug=True))
        backend = LocalBackend(engine)
        app = RadixChatApp(
            settings, backend_factory=lambda s, p: backend, panel_interval=None, session=session
        )
        return app, backend

    kv_dir = tui_env / "kv"
    app, _ = app_with(kv_dir, "rivers")
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "Name a long river in Africa.")
        history = len(app.chat.state.conv.ids)
        await pilot.press("ctrl+q")
    saved = load_session(session_path(settings.sessions_dir, "rivers"))

    replies = []
    for store in (kv_dir, None):
        app, backend = app_with(store, saved)
        async with app.run_test(size=TERMINAL) as pilot:
            await ready(app, pilot)
            # the history is in the tree (loaded, or prefilled in the background)
            await wait_until(lambda b=backend: b.stats().tree_tokens >= history - 1, pilot=pilot, timeout=60)
            await say(app, pilot, "How long is it?")
            usage = app.chat.state.conv.messages[-1].meta["usage"]
            replies.append(app.chat.state.conv.messages[-1].content)
            stats = backend.stats()
            await app.chat.refresh_panels_now()
            labels = [str(n.label) for n in app.query_one(CacheTree).root.children]
            await pilot.press("ctrl+q")
        if store is not None:
            assert stats.kv_loaded_tokens == history - 1  # the history came from disk ...
            assert usage["cached_tokens"] >= history - 1
            assert any("↓" in label for label in labels)  # ... and the tree panel says so
        else:
            assert stats.kv_loaded_tokens == 0 and not any("↓" in label for label in labels)
    assert replies[0] == replies[1]
