"""The import structure: no cycle in braid, the settings on the ground floor, no quart in the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import braid

SRC = Path(braid.__file__).parent.parent


def _module(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The braid modules ``path`` imports anywhere in it (inside functions too: a cycle that is
    only broken by importing late is still a cycle)."""
    name = _module(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return (found & modules) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_in_braid() -> None:
    paths = sorted((SRC / "braid").rglob("*.py"))
    modules = {_module(p) for p in paths}
    graph = {_module(p): _imports(p, modules) for p in paths}
    assert graph["braid.http.forwarded"] >= {"braid.addresses", "braid.http.asgi"}  # the parser sees edges
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _imported_by(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_the_settings_import_nothing_of_the_http_edge() -> None:
    ground = {"braid", "braid.settings", "braid.addresses"}
    assert {m for m in _imported_by("braid.settings") if m.startswith("braid")} <= ground


def test_the_cli_imports_no_quart() -> None:
    """vLLM's engine process re-imports the main module (spawn) and calls hasattr() on every
    module global, which quart's proxies answer with RuntimeError (braid.cli.main)."""
    assert not {m for m in _imported_by("braid.cli.main") if m.split(".")[0] in ("quart", "quart_trio")}
