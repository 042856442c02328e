"""The package's structure: which layers import which, and the size rules of the code.

Modules import one another within a package freely (the IR builder and its printer), but
no cycle of imports spans two packages, and the graph and IR layers import nothing from
the layers that use them. Imports inside functions count (they run); imports under
``if TYPE_CHECKING:`` do not (they never run). ``python -m tests.test_layers`` prints the
largest strongly connected sets of modules.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1] / "treadle"
# Where a target is named by kind, its device's executable checked, or the host CPU taken
# by default: the targets, the code generators and runtimes per target, and the public
# entry points.
TARGET_AWARE = ("target/", "backend/", "runtime/", "api.py", "cli/", "compiler.py",
                "integrations/", "deploy/")
TARGET_BRANCH = re.compile(r'kind\s*[!=]=\s*"(cpu|cuda)"|isinstance\([^)]*CudaExecutable'
                           r'|\bor host\(\)')
MAX_FUNCTION_LINES = 60
MAX_DRIVER_LINES = 200


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("treadle", *path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(node: ast.AST, name: str, is_package: bool, known) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = name.split(".")[: len(name.split(".")) - node.level + is_package]
        base = ".".join([*package, base] if base else package)
    submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    # `from package import module` reads the module, not the package's own names.
    return submodules if len(submodules) == len(node.names) else [base, *submodules]


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack += node.orelse
            continue
        yield node
        stack += ast.iter_child_nodes(node)


def import_graph() -> nx.DiGraph:
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        graph.add_node(name)
        tree = ast.parse(path.read_text())
        for node in _runtime_nodes(tree):
            for target in _imported(node, name, path.name == "__init__.py", known):
                if target in known and target != name:
                    graph.add_edge(name, target)
    return graph


def package(module: str) -> str:
    """A module's package below treadle; treadle's own modules are package "treadle"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and _is_package(module)) \
        else "treadle"


def _is_package(module: str) -> bool:
    return (ROOT / module.split(".", 1)[1].replace(".", "/") / "__init__.py").exists()


def cycles() -> list[set[str]]:
    """The strongly connected sets of modules, largest first."""
    return sorted(nx.strongly_connected_components(import_graph()), key=len, reverse=True)


def test_no_import_cycle_spans_two_packages():
    spanning = [(len(c), sorted({package(m) for m in c})) for c in cycles()
                if len({package(m) for m in c}) > 1]
    assert not spanning


def test_graph_and_ir_import_nothing_from_the_layers_above():
    above = ("treadle.compiler", "treadle.tune", "treadle.orchestrate", "treadle.api")
    graph = import_graph()
    wrong = [(a, b) for a, b in graph.edges if package(a) in ("graph", "ir")
             and b.startswith(above)]
    assert not wrong


def test_targets_are_branched_on_only_where_they_are_made():
    found = [f"{path.relative_to(ROOT)}:{k}: {line.strip()}"
             for path in ROOT.rglob("*.py")
             if not str(path.relative_to(ROOT)).startswith(TARGET_AWARE)
             for k, line in enumerate(path.read_text().splitlines(), 1)
             if TARGET_BRANCH.search(line)]
    assert not found


def test_functions_are_short_and_the_driver_fits_a_screen():
    long = [f"{path.relative_to(ROOT)}: {node.name} ({node.end_lineno - node.lineno + 1})"
            for path in ROOT.rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long
    assert len((ROOT / "compiler.py").read_text().splitlines()) < MAX_DRIVER_LINES


def test_the_analysis_sees_a_cycle_across_packages(tmp_path, monkeypatch):
    """The check can fail: two modules of different packages importing each other form
    a spanning set."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for pkg, other in (("a", "b"), ("b", "a")):
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "m.py").write_text(f"from treadle.{other} import m\n")
    monkeypatch.setattr("tests.test_layers.ROOT", tmp_path)
    assert [sorted(c) for c in cycles() if len(c) > 1] == [["treadle.a.m", "treadle.b.m"]]
    assert {package(m) for m in cycles()[0]} == {"a", "b"}


if __name__ == "__main__":
    for group in cycles()[:5]:
        print(len(group), sorted({package(m) for m in group}), sorted(group)[:8])
