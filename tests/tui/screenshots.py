"""Render the app's documentation screenshots: ``python -m tests.tui.screenshots [OUT_DIR] [--all]``.

- ``screenshot-main.png``: the real bundled model (SmolLM2-135M on this machine's CPU, greedy), two turns,
  the second regenerated and switched back, so the cache tree shows the fork (~40 s on 2 cores).
- ``screenshot-tools.png``: a tool turn from the snapshot tests' scripted backend (the 135M model is no
  reliable tool caller), shown as the model "scripted-demo".
- with ``--all``, also the consent dialog, the tools screen and the narrow layout, to look at.

SVG from Textual, PNG from headless Chromium when it is installed (sharp text), else cairosvg.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from radixchat.config import Settings, UserToolConfig
from radixchat.tui.app import RadixChatApp
from tests.tui.conftest import ToolFakeBackend, call_then_answer, ready, say, turn_done, wait_until
from tests.tui.test_snapshots import NARROW, WIDE, app_for, settle, tool_plan, tool_turn, two_turns

FONT = "DejaVu Sans Mono"  # Textual's SVG asks for Fira Code, which a headless renderer seldom has


def svg_to_png(svg: str, out: Path) -> None:
    svg = svg.replace("Fira Code, monospace", FONT).replace('"Fira Code"', f'"{FONT}"')
    width, height = (int(float(v)) for v in re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg).groups())
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        import cairosvg

        cairosvg.svg2png(bytestring=svg.encode(), write_to=str(out), output_width=width)
        return
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "shot.svg"
        src.write_text(svg)
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--window-size={width},{height}", f"--screenshot={out.resolve()}", src.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip


async def shoot(app: Any, size: tuple[int, int], scene: Callable[[Any], Awaitable[None]], out: Path) -> None:
    async with app.run_test(size=size) as pilot:
        await scene(pilot)
        svg = app.export_screenshot()
    svg_to_png(svg, out)
    print(out)


async def real_main_scene(pilot: Any) -> None:
    app = pilot.app
    await ready(app, pilot)
    await say(app, pilot, "What is the capital of France?", timeout=120)
    await say(app, pilot, "Write a Python function that adds two numbers. Only the code.", timeout=120)
    app.chat.state.sampling = app.chat.state.sampling.model_copy(update={"temperature": 0.7, "seed": 1})
    done = app.chat.turns_finished
    await pilot.press("ctrl+r")  # a second branch, sampled: the tree forks after the shared prefix
    await turn_done(app, pilot, done, timeout=120)
    await app.chat.switch_branch(0)
    await app.chat.refresh_panels_now()
    await settle(pilot)


async def consent_scene(pilot: Any) -> None:
    app = pilot.app
    await ready(app, pilot)
    await app.chat.action_set_mode("tool")
    app.chat.state.tool_names = ["calculator", "weather"]
    await say(app, pilot, "Do I need an umbrella in Lisbon tomorrow?", wait=False)
    await wait_until(lambda: type(app.screen).__name__ == "ConsentScreen" and app.screen.armed, pilot=pilot)
    await pilot.pause(0.3)


async def tools_screen_scene(pilot: Any) -> None:
    app = pilot.app
    await ready(app, pilot)
    await app.chat.action_set_mode("tool")
    await pilot.press("f4")
    await wait_until(lambda: type(app.screen).__name__ == "ToolsScreen", pilot=pilot)
    await pilot.pause(0.3)


async def main(out_dir: Path, everything: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out_dir.mkdir(parents=True, exist_ok=True)
        real = Settings.load(
            {
                "sessions_dir": str(Path(tmp) / "real"),
                "temperature": 0,
                "max_tokens": 150,
                "kv_pool_tokens": 4096,
                "system_prompt": "You are a helpful assistant. Keep answers short.",
            }
        )
        app = RadixChatApp(real, session="demo", panel_interval=None)
        await shoot(app, WIDE, real_main_scene, out_dir / "screenshot-main.png")
        settings = Settings.load({"sessions_dir": str(Path(tmp) / "sessions"), "model": "fake-model"})
        scripted = ToolFakeBackend(tool_plan)
        scripted.model_name = "scripted-demo"
        tools = app_for(
            settings.model_copy(update={"model": "scripted-demo"}), backend=scripted, session="budget"
        )
        await shoot(tools, WIDE, tool_turn, out_dir / "screenshot-tools.png")
        if not everything:
            return
        weather = UserToolConfig(
            name="weather",
            description="Tomorrow's forecast for a city (from the met office's API).",
            command=["python3", "~/bin/forecast.py"],
            parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        )
        with_tool = settings.model_copy(update={"tools": [weather]})
        fake = ToolFakeBackend(call_then_answer("weather", {"city": "Lisbon"}))
        await shoot(app_for(with_tool, backend=fake), WIDE, consent_scene, out_dir / "screenshot-consent.png")
        await shoot(app_for(with_tool), WIDE, tools_screen_scene, out_dir / "screenshot-tools-screen.png")
        await shoot(app_for(settings), NARROW, two_turns, out_dir / "screenshot-narrow.png")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    asyncio.run(main(Path(args[0] if args else "docs"), "--all" in sys.argv))
