"""The package's layering, as DESIGN.md draws it, checked on the source and in fresh interpreters.

- No import cycles among radixchat's modules: no module imports a module that imports it back, even
  inside a function or under ``TYPE_CHECKING`` (a loop of imports is a missing seam).
- The engine never imports grammar, Textual, the chat layer or the app's config; grammar never imports the
  engine, the chat layer or Textual; the chat layer never imports Textual; batch mode never imports
  Textual; only the local backend, ``chat/local.py`` and ``chat/engine_settings.py`` (its engine's config
  from the app's settings), and ``chat/loading.py``, which picks it, of the chat layer reach the engine.
- The remote path (``--backend URL``: the protocol, ``TurnResult``, the remote backend, batch mode) never
  imports torch or transformers, and neither does the app until the backend loads.
- The app's modules stay small, never import torch, and each screen has its stylesheet; ``screens/`` (the
  dialogs the controllers open) never imports the controllers or the chat screen, and the chat screen's
  ``ChatCore`` loads no Textual.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import radixchat

PACKAGE = Path(radixchat.__file__).parent
TUI = PACKAGE / "tui"

# Cycles another issue is untying: none may be added, and an entry must go once its cycle is gone.
KNOWN_CYCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}
MODULE, LAZY, TYPE = "module", "lazy", "type"  # at import time, inside a function, under TYPE_CHECKING


def imports(name: str) -> list[tuple[str, str]]:
    """(what, kind) for every import in ``name``'s source: radixchat modules by their full name
    (``from a.b import c`` is ``a.b.c`` when that is a module, else ``a.b``), other packages by their
    top-level name."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        if isinstance(node, ast.Import):
            out.extend((a.name if a.name in MODULES else a.name.split(".")[0], kind) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
            if base.split(".")[0] != "radixchat":
                out.append((base.split(".")[0], kind))
            else:
                out.extend(
                    (f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base, kind) for a in node.names
                )
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            kind = TYPE
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and kind == MODULE:
            kind = LAZY
        for child in ast.iter_child_nodes(node):
            visit(child, kind)

    visit(ast.parse(path.read_text(), str(path)), MODULE)
    return [(what, kind) for what, kind in out if what != name]


IMPORTS = {name: imports(name) for name in MODULES}
GRAPH = {name: {w for w, _ in IMPORTS[name] if w in MODULES} for name in MODULES}


def cycles() -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = {stack.pop()}
            while v not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.add(frozenset(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def loaded_with(name: str) -> set[str]:
    """What importing ``name`` loads: its import-time imports, transitively (not those inside functions
    or under TYPE_CHECKING); radixchat modules by name, other packages by their top-level name."""
    seen = {name}
    todo = [name]
    while todo:
        for what, kind in IMPORTS[todo.pop()]:
            if kind == MODULE and what not in seen:
                seen.add(what)
                if what in MODULES:
                    todo.append(what)
    return seen


def layer(prefix: str) -> list[str]:
    return sorted(m for m in MODULES if m == prefix or m.startswith(prefix + "."))


def test_the_import_graph_sees_every_kind_of_import():
    local, loading = IMPORTS["radixchat.chat.local"], IMPORTS["radixchat.chat.loading"]
    assert ("radixchat.chat.backend", MODULE) in local  # from a.b import c
    assert ("radixchat.grammar.errors", MODULE) in IMPORTS["radixchat.grammar.compiler"]  # from .errors
    assert ("radixchat.chat.local", LAZY) in loading  # inside a function
    assert ("radixchat.engine.stats", TYPE) in IMPORTS["radixchat.chat.backend"]  # under TYPE_CHECKING
    assert ("torch", MODULE) in IMPORTS["radixchat.engine.kv_pool"]


def test_no_import_cycles():
    found = cycles()
    assert found <= KNOWN_CYCLES, sorted(sorted(c) for c in found - KNOWN_CYCLES)
    gone = KNOWN_CYCLES - found
    assert not gone, f"no longer cycles, remove them from KNOWN_CYCLES: {sorted(sorted(c) for c in gone)}"


ABOVE = {
    "radixchat.engine": (
        "radixchat.config",
        "radixchat.grammar",
        "radixchat.chat",
        "radixchat.tui",
        "radixchat.batch",
        "textual",
    ),
    "radixchat.grammar": (
        "radixchat.engine",
        "radixchat.chat",
        "radixchat.tui",
        "radixchat.batch",
        "textual",
    ),
    "radixchat.chat": ("radixchat.tui", "radixchat.batch", "textual"),
    "radixchat.batch": ("radixchat.tui", "textual"),
}


@pytest.mark.parametrize("lower", list(ABOVE))
def test_a_layer_never_imports_the_layers_above_it(lower):
    """Not even inside a function or for type hints."""
    for name in layer(lower):
        bad = sorted({what for what, _ in IMPORTS[name] if what.startswith(ABOVE[lower])})
        assert not bad, f"{name} imports {bad}"


def test_only_the_local_backend_imports_the_engine_and_the_grammar_engine():
    """Of the chat layer, the local backend (``local.py`` and ``engine_settings.py``, which only it imports)
    and ``loading.py``, inside the function that picks it; the others may name the engine's plain-data
    stats in type hints."""
    local = {MODULE, LAZY, TYPE}
    allowed = {
        "radixchat.chat.local": local,
        "radixchat.chat.engine_settings": local,
        "radixchat.chat.loading": {LAZY, TYPE},
    }
    for name in layer("radixchat.chat"):
        for what, kind in IMPORTS[name]:
            if what == "radixchat.engine.stats" and kind == TYPE:
                continue
            if what.startswith(("radixchat.engine", "radixchat.grammar", "torch", "transformers")):
                assert kind in allowed.get(name, set()), f"{name} imports {what} ({kind})"


@pytest.mark.parametrize(
    "name",
    [
        "radixchat.chat.backend",
        "radixchat.chat.remote",
        "radixchat.chat.tool_turn",
        "radixchat.chat.loading",
        "radixchat.chat.session_state",
        "radixchat.batch",
        "radixchat.cli",
        "radixchat.tui.app",
        "radixchat.tool_format",
        "radixchat.sampling",
    ],
)
def test_the_remote_path_loads_neither_torch_nor_the_engine(name):
    """In the source: importing these loads no engine, grammar engine, torch or transformers (the app and
    batch mode import the in-process engine only in the function that loads it)."""
    heavy = ("radixchat.engine", "radixchat.grammar", "torch", "transformers")
    assert not sorted(m for m in loaded_with(name) if m.startswith(heavy)), name


REMOTE_RUN = """
import asyncio, sys
sys.path.insert(0, {root!r})
from tests.remote.fake_server import FakeServer
from radixchat.chat.backend import grammar_for, sampling_params
from radixchat.chat.modes import ConstraintSpec
from radixchat.chat.loading import load_backend
from radixchat.chat.tool_turn import run_tool_turn
from radixchat.chat.tools import ToolContext, ToolRegistry, allow_listed
from radixchat.config import Settings

async def main():
    server = FakeServer().start()
    settings = Settings.load({{"backend": server.url, "model": "fake-model"}})
    backend = await asyncio.to_thread(load_backend, settings)
    await backend.start()
    conv = backend.new_conversation(system="Be brief.")
    conv.add_user("Hi")
    json_mode = grammar_for(backend, ConstraintSpec("json", {{"type": "object"}}))
    result = await backend.reply(conv, sampling_params(settings), json_mode).result()
    registry = ToolRegistry.from_config([])
    turn = await run_tool_turn(backend, conv, "Again", sampling_params(settings), registry.select(None),
                               registry, ToolContext(), allow_listed(set()))
    await backend.aclose()
    server.stop()
    assert result.finish_reason == "stop" and turn.final.finish_reason == "stop", (result, turn.final)

asyncio.run(main())
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def test_a_remote_chat_never_imports_torch_or_transformers():
    """At run time: a whole remote conversation (a JSON-mode reply and a tool turn) in a fresh
    interpreter, against the fake OpenAI-compatible server."""
    code = REMOTE_RUN.format(root=str(PACKAGE.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_importing_the_app_and_batch_mode_does_not_import_torch():
    code = (
        "import sys, radixchat.tui.app, radixchat.batch, radixchat.cli; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_app_and_batch_mode_import_pypdf_only_for_a_pdf_and_mcp_only_for_a_server():
    """(tests/tui/test_mcp_app.py checks that the first frame comes before mcp even with a server.)"""
    code = (
        "import sys, radixchat.cli, radixchat.tui.app, radixchat.batch, radixchat.batch.list_tools; "
        "print(sorted(m for m in ('pypdf', 'mcp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_first_frame_loads_no_modal_screen():
    """Start-up (issue 12: ``--backend URL`` to a usable prompt in <= 0.5 s) imports only what the chat
    screen draws: the dialogs and screens that open on a key load when they open."""
    modal = [
        f"radixchat.tui.screens.{m}"
        for m in ("attach", "branches", "dialogs", "models", "schema", "sessions", "settings", "tools")
    ]
    code = f"import sys, radixchat.cli, radixchat.tui.app; print(sorted(m for m in {modal!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_tui_module_imports_torch_directly():
    for path in TUI.rglob("*.py"):
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path


def test_modules_stay_small_and_each_screen_has_its_stylesheet():
    for path in TUI.rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 400, path
    for path in (TUI / "screens").glob("*.py"):
        if path.name != "__init__.py":
            assert path.with_suffix(".tcss").exists(), path


# The app's controllers and what they drive: modules above the dialogs the controllers open.
TUI_CONTROLLERS = (
    "radixchat.tui.app",
    "radixchat.tui.chat_screen",
    "radixchat.tui.chat_core",
    "radixchat.tui.turn_control",
    "radixchat.tui.session_control",
    "radixchat.tui.tool_turn_view",
    "radixchat.tui.lenient",
    "radixchat.tui.host",
    "radixchat.tui.attach_control",
    "radixchat.tui.model_control",
)


def test_the_screens_never_import_the_controllers_or_the_chat_screen():
    """``screens/`` holds the dialogs the controllers open; no arrow points back up, not even for type
    hints or inside a function."""
    for name in layer("radixchat.tui.screens"):
        bad = sorted({what for what, _ in IMPORTS[name] if what in TUI_CONTROLLERS})
        assert not bad, f"{name} imports {bad}"


def test_the_chat_core_needs_no_textual():
    """What the chat screen decides (the backend, the mode's constraint, the tools offered) runs without
    Textual, so it can be read and tested as plain Python."""
    assert "textual" not in loaded_with("radixchat.tui.chat_core")
