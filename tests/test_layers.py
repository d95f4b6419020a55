"""The package layers (``.importlinter``) hold: imports only point down, function-level ones too."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_imports_point_down_the_layers():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    assert lint, "import-linter is a dev dependency (pip install -e '.[dev]')"
    result = subprocess.run(
        [lint, "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "1 kept, 0 broken" in result.stdout


def _cycles(graph) -> list[list[str]]:
    """Every strongly connected set of two or more modules in the import graph: modules that reach
    each other through imports (a pair importing each other, or a longer loop). Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return components


def test_no_modules_import_each_other():
    """No loop of imports between polyrl's modules, however deep or hidden inside a function (grimp
    reads function-level imports too): a loop hides the order of definition a reader must guess.
    A package's ``__init__`` counts as a module of its own (it imports nothing here)."""
    import sys

    import grimp

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    graph = grimp.build_graph("polyrl", cache_dir=None)
    assert _cycles(graph) == []
