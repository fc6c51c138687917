"""The benchmark harness (benchmarks/) stays a stack: its imports point one way and no module
grows near a thousand lines.

Imports are read from the source (ast), every one of them: at module level, inside functions and
under `if TYPE_CHECKING:`, because a circle of type-only imports is still two modules that cannot
be understood apart. `from scenarios import register` is an import of `scenarios/__init__.py`;
`from scenarios import guest_memory` one of `scenarios/guest_memory.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    """The name a module is imported by: benchmarks/ itself is on sys.path when they run."""
    parts = list(path.relative_to(BENCH).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(BENCH.rglob("*.py")) if "results" not in p.parts}


def _imported(node: ast.AST, module: str, path: Path) -> Iterator[str]:
    """Every name an import statement may load (a package and what it names in it)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = ".".join(p for p in (package, node.module or "") if p)
        else:
            base = node.module or ""
        yield base
        for alias in node.names:
            yield f"{base}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """module -> the benchmark modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {
            target
            for node in ast.walk(tree)
            for target in _imported(node, name, path)
            if target in modules and target != name
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each group of modules that import one another (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_the_import_graph_is_read():
    # guards the two tests below against passing on an empty or misread graph
    graph = import_graph()
    assert {"run", "scenarios", "scenarios.base", "scenarios.datasets"} <= graph.keys()
    assert "scenarios.datasets" in graph["run"]
    assert "scenarios" in graph["scenarios.small_files"]  # from scenarios import register


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_benchmark_imports_point_one_way():
    found = cycles(import_graph())
    assert not found, "benchmark modules that import each other: " + "; ".join(
        " <-> ".join(group) for group in found
    )


def test_no_benchmark_module_is_huge():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not big, f"benchmark modules over {MAX_LINES} lines (split them): {big}"
