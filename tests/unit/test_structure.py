"""The package's shape (issue #25): no import circles, the library never imports the CLI, a dozen rooms.

Read from the source with ``ast`` (module-level and in-function imports alike), so an import that only
runs in one branch still counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bbrlab

ROOT = Path(bbrlab.__file__).parent
MAX_TOP_LEVEL_ENTRIES = 12
#: "No module over about 500 lines" (issue #25): a little slack for the docstrings every public name carries.
MAX_MODULE_LINES = 540


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        if "guest" in path.parts or "__pycache__" in path.parts:
            continue
        parts = ["bbrlab", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _known(name: str, modules: dict) -> str | None:
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or None


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and ast.unparse(block.test).endswith("TYPE_CHECKING") for n in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: never imported at run time
            continue
        if isinstance(node, ast.Import):
            found |= {_known(a.name, modules) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                sub = f"{src}.{a.name}"
                found.add(sub if sub in modules else _known(src, modules))
    # importing an ancestor package is implied by Python itself; it is not an edge
    return {m for m in found if m and m != name and not name.startswith(m + ".")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    assert _circles(_graph()) == []


def test_the_library_never_imports_the_cli():
    offenders = {m: sorted(t for t in targets if t.startswith("bbrlab.cli"))
                 for m, targets in _graph().items() if not m.startswith("bbrlab.cli")}
    assert {m: t for m, t in offenders.items() if t} == {}


def test_about_a_dozen_entries_at_the_top_of_the_package():
    entries = [p.name for p in ROOT.iterdir() if p.name not in ("__init__.py", "__pycache__")]
    assert len(entries) <= MAX_TOP_LEVEL_ENTRIES, sorted(entries)


def _undocumented() -> list[str]:
    """Public functions, classes and methods (names without a leading underscore) that have no docstring."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        if "guest" in path.parts:
            continue

        def visit(node, prefix: str, path=path) -> None:
            for n in ast.iter_child_nodes(node):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("_"):
                    if not ast.get_docstring(n):
                        out.append(f"{path.relative_to(ROOT)}:{n.lineno} {prefix}{n.name}")
                    if isinstance(n, ast.ClassDef):
                        visit(n, f"{prefix}{n.name}.", path)

        visit(ast.parse(path.read_text()), "")
    return out


def test_every_public_function_and_class_has_a_docstring():
    assert _undocumented() == []


def test_no_module_over_about_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if "guest" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
