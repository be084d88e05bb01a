"""The adapter's modules form a tree: no module imports, even lazily inside a
function, a module that imports it back (directly or through others)."""

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parent.parent / "fsdpcheck_torch"


def _imports(path):
    """The package modules `path` imports relatively, anywhere in the file."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(a.name for a in node.names)
    return out


def test_no_import_cycle():
    graph = {p.stem: _imports(p) for p in PKG.glob("*.py")}
    state = {}  # 1: on the current path, 2: done

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(m) :], m]))
        if state.get(m) == 2 or m not in graph:
            return
        state[m] = 1
        for n in sorted(graph[m]):
            visit(n, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
