"""The package's import graph has no circle: every module can be read (and imported) after the
modules it uses."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO


def import_graph(package: Path = REPO / "eagleflow") -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in it, function bodies included)."""
    graph = {}
    for path in package.rglob("*.py"):
        name = ".".join(path.relative_to(package.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        used = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                used.add(node.module)
            elif isinstance(node, ast.Import):
                used.update(alias.name for alias in node.names)
        graph[name] = {m for m in used if m.split(".")[0] == package.name and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle found by a depth-first walk (empty when there is none)."""
    found, done = [], set()

    def walk(module: str, path: list[str]) -> None:
        for used in sorted(graph.get(module, ())):
            if used in path:
                found.append([*path[path.index(used) :], used])
            elif used not in done:
                walk(used, [*path, used])
        done.add(module)

    for module in sorted(graph):
        walk(module, [module])
    return found


def test_package_has_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "eagleflow.shards.writer" in graph
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


if __name__ == "__main__":  # print the graph: python tests/test_imports.py
    for module, used in sorted(import_graph().items()):
        print(f"{module} -> {', '.join(sorted(used)) or '-'}")
    print("cycles:", cycles(import_graph()))
