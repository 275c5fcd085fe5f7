"""Live panels: cache tree (incremental), hit rate, memory, speed; toggled, hidden on narrow terminals."""

from __future__ import annotations

from radixchat.engine.stats import TreeNodeView
from radixchat.tui.widgets.cache_tree import CacheTree, clean_snippet
from radixchat.tui.widgets.side_panel import SidePanel
from tests.tui.conftest import TERMINAL, ready, say


def text_of(app, selector: str) -> str:
    return str(app.query_one(selector).render())


async def test_panels_show_the_cache_hit_rate_memory_and_speed_after_a_turn(make_app, fake):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        await say(app, pilot, "one")
        await say(app, pilot, "two")
        await app.chat.refresh_panels_now()
        await pilot.pause()
        stats = fake.stats()
        last = stats.last_request
        assert f"{last.cached_tokens / last.prompt_tokens:.0%}" in text_of(app, "#hit-rate .numbers")
        memory = text_of(app, "#memory")
        assert f"KV pool {stats.pool_used:,}/4,096 tok" in memory and "cpu     RSS 512.0 MiB" in memory
        speed = text_of(app, "#speed")
        assert "TTFT    12 ms" in speed and "42.0 tok/s" in speed
        tree = app.query_one(CacheTree)
        assert tree.drawn_ids == {n.id for n in stats.tree}
        # the current conversation's path is drawn in bold
        path = fake.cached_path(app.chat.state.conv.ids)
        assert path and all(tree._drawn_sig[i][3] for i in path)
        assert len(app.chat.state.hit_history) == 2


async def test_the_cache_tree_is_updated_incrementally(make_app):
    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        tree = app.query_one(CacheTree)
        a = TreeNodeView(1, None, 10, "<|im_start|>system\nhi", False, 1)
        b = TreeNodeView(2, 1, 5, "hello", True, 2)
        tree.apply([a, b], [1, 2], "2 nodes")
        first_a = tree._drawn[1]
        n = tree.updates
        tree.apply([a, b], [1, 2], "2 nodes")
        assert tree.updates == n  # nothing changed, nothing redrawn
        tree.apply([a, TreeNodeView(2, 1, 5, "hello", False, 3)], [1], "2 nodes")
        assert tree.updates == n + 1 and tree._drawn[1] is first_a  # one label, same nodes
        # a split: node 3 takes the first 4 tokens of node 2, which moves under it
        tree.apply(
            [
                a,
                TreeNodeView(3, 1, 4, "hell", False, 4),
                TreeNodeView(2, 3, 1, "o", False, 4),
                TreeNodeView(4, 3, 2, "p!", False, 4),
            ],
            [1, 3, 4],
            "4 nodes",
        )
        assert tree._drawn[1] is first_a and tree.drawn_ids == {1, 2, 3, 4}
        assert tree._drawn[2].parent is tree._drawn[3] and tree._drawn[3].allow_expand
        tree.apply([a], [], "1 node")  # eviction
        assert tree.drawn_ids == {1} and str(tree.root.label) == "1 node"


def test_snippets_are_one_line_and_short():
    assert clean_snippet("a\nb\tc") == "a⏎b c"
    assert len(clean_snippet("x" * 100)) == 26 and clean_snippet("x" * 100).endswith("…")


async def test_panels_hide_on_narrow_terminals_and_toggle_with_ctrl_b(make_app):
    app = make_app()
    async with app.run_test(size=(80, 30)) as pilot:
        await ready(app, pilot)
        side = app.query_one(SidePanel)
        assert not side.display
        await pilot.press("ctrl+b")
        assert side.display
        await pilot.resize_terminal(140, 40)
        await pilot.pause()
        assert side.display
        await pilot.press("ctrl+b")
        assert not side.display
        await pilot.resize_terminal(80, 30)
        await pilot.pause()
        await pilot.resize_terminal(140, 40)
        await pilot.pause()
        assert side.display  # back to automatic once the width crossed the threshold


async def test_a_window_too_narrow_for_the_panels_refuses_them_and_survives_resizes(make_app):
    """At 48 columns the 44-column panel squeezed the prompt to width 0 and Textual crashed."""
    app = make_app()
    async with app.run_test(size=(48, 20)) as pilot:
        await ready(app, pilot)
        side = app.query_one(SidePanel)
        await pilot.press("ctrl+b")
        await pilot.pause()
        assert not side.display
        assert any("at least 80 columns" in n.message for n in app._notifications)
        for width in (140, 40, 140, 60, 120):
            await pilot.resize_terminal(width, 30)
            await pilot.pause()
            assert side.display == (width >= 110)
            assert app.chat.prompt.size.width > 0
        await say(app, pilot, "still here")
        assert app.chat.state.conv.messages[-1].content == "You said: **still here**"


async def test_the_memory_panel_shows_cuda_allocated_and_reserved_on_a_gpu(make_app, fake):
    import dataclasses

    from radixchat.tui.widgets.memory import MemoryPanel

    app = make_app()
    async with app.run_test(size=TERMINAL) as pilot:
        await ready(app, pilot)
        stats = dataclasses.replace(
            fake.stats(), device="cuda:0", device_allocated=3 * 2**30, device_reserved=4 * 2**30
        )
        panel = app.query_one(MemoryPanel)
        panel.show(stats)
        text = str(panel.render())
        assert "cuda:0  3.0 GiB allocated" in text and "4.0 GiB reserved" in text and "RSS" not in text
