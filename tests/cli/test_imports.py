"""The import structure: no cycle in braid, every import downwards by layer (docs/architecture.md's
folder map), mergers without trio, the settings on the ground floor, no quart in the CLI."""

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


LAYERS = (
    ("braid", "braid.errors", "braid.settings", "braid.logs", "braid.metrics", "braid.addresses"),
    ("braid.store",),
    ("braid.engine", "braid.models"),
    ("braid.wire",),
    ("braid.stream",),
    ("braid.routes", "braid.batch"),
    ("braid.http",),
    ("braid.cli", "braid.__main__"),
)
"""src/braid's layers, lowest first: the root modules, the store, the engines (and the model they
are tested on), the OpenAI wire format, the route-independent stream machinery, the routes and
the batch jobs that run through them, the HTTP edge, the entry points. A module imports only from its own layer and the layers below."""


def _layer(module: str) -> int:
    if module in LAYERS[0]:  # the root modules by name: every module's name starts with "braid"
        return 0
    for depth, prefixes in enumerate(LAYERS[1:], start=1):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return depth
    raise AssertionError(f"{module} is in no layer of LAYERS: put it in a layer's folder")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if _layer(t) > _layer(m))


def test_every_import_points_down_the_layers() -> None:
    paths = sorted((SRC / "braid").rglob("*.py"))
    modules = {_module(p) for p in paths}
    graph = {_module(p): _imports(p, modules) for p in paths}
    assert _upward(graph) == []
    # the check itself: a wire module importing a route is upward, a route importing wire is not
    assert _upward({"braid.wire.x": {"braid.routes.y"}, "braid.routes.y": {"braid.wire.x"}}) == [
        "braid.wire.x -> braid.routes.y"
    ]


def test_the_root_holds_at_most_eight_modules() -> None:
    root = {p.stem for p in (SRC / "braid").glob("*.py")} - {"__init__", "__main__"}
    assert len(root) <= 8, sorted(root)
    assert {f"braid.{m}" for m in root} <= set(LAYERS[0]), "a new root module must be in the ground layer"


def test_the_mergers_import_no_trio() -> None:
    """The merge is pure: driven by the run's consumer, it must not reach trio through any module."""
    for module in ("braid.stream.merge", "braid.wire.completions_response", "braid.wire.chat_response"):
        assert "trio" not in _imported_by(module), module


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
