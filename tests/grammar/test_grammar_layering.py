"""The grammar package's layering: the mask engine never imports ``schema/``, and no module imports a
module that imports it back (not even inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import radixchat.grammar

GRAMMAR = Path(radixchat.grammar.__file__).parent


def _module(path: Path) -> str:
    rel = path.relative_to(GRAMMAR).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["radixchat", "grammar", *parts])


def _imports(path: Path) -> set[str]:
    """Modules of radixchat.grammar that ``path`` imports at run time (``TYPE_CHECKING`` blocks aside)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            skip |= {id(sub) for sub in ast.walk(node)}
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        for alias in node.names:
            full = f"{mod}.{alias.name}"
            out.add(full if (GRAMMAR / Path(*full.split(".")[2:])).with_suffix(".py").exists() else mod)
    return {m for m in out if m.startswith("radixchat.grammar")}


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in GRAMMAR.rglob("*.py")}


def test_the_mask_engine_does_not_import_the_schema_package():
    for mod, deps in _graph().items():
        if mod == "radixchat.grammar" or mod.startswith("radixchat.grammar.schema"):
            continue
        assert not {d for d in deps if d.startswith("radixchat.grammar.schema")}, mod


def test_no_module_imports_a_module_that_imports_it_back():
    graph = _graph()
    packages = {m for m in graph if (GRAMMAR / Path(*m.split(".")[2:]) / "__init__.py").exists()}
    for start in graph:
        if start in packages:
            continue
        seen: set[str] = set()
        todo = [d for d in graph[start] if d not in packages]
        while todo:
            mod = todo.pop()
            assert mod != start, f"{start} imports itself back"
            if mod in seen:
                continue
            seen.add(mod)
            todo += [d for d in graph.get(mod, ()) if d not in packages]
