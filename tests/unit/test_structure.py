"""The package's shape (issues #25, #37): no import circles, each room imports only what its rule allows, the
library never imports the CLI, a dozen rooms.

Read from the source with ``ast``: module-level, in-function and type-only (``if TYPE_CHECKING:``) imports alike,
so an import that only runs in one branch, or only for a type checker, still counts. ``from . import x`` is an
edge to the module ``x``; taking a name from a package's ``__init__`` is an edge to that package, ancestors
included. The rules are the "May import:" line of each room's docstring (its ``__init__.py``, or the module
for a room of one file), read here, so the rule a reader sees is the rule that is checked.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bbrlab

ROOT = Path(bbrlab.__file__).parent
#: "About a dozen" (issue #25): 11 rooms then; #37 gave the scenario model and the calibration rooms of their own.
MAX_TOP_LEVEL_ENTRIES = 14


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
    found = set()
    for node in ast.walk(tree):
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
    return {m for m in found if m and m != name}


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


# -- the rooms' rules ------------------------------------------------------------------------------------
def _room(module: str) -> str:
    """``bbrlab.run.runner`` -> ``run``; ``bbrlab.demo`` -> ``demo``; the package's face is ``bbrlab``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "bbrlab"


def _rule_text(room: str) -> str:
    """The "May import:" paragraph of ``room``'s docstring ("" when it states none)."""
    path = ROOT / room / "__init__.py" if (ROOT / room).is_dir() else ROOT / f"{room}.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    start = doc.find("May import:")
    if start < 0:
        return ""
    return doc[start:].split("\n\n")[0]


def _rules() -> dict[str, set[str] | None]:
    """Each room's allowed rooms (None: every room but the CLI, the rule of the top of the house)."""
    rooms = {_room(m) for m in _modules()} - {"bbrlab"}
    out: dict[str, set[str] | None] = {}
    for room in sorted(rooms):
        text = _rule_text(room)
        allowed_part = text.split("Never")[0]
        out[room] = None if "every other room" in allowed_part else set(re.findall(r"``bbrlab\.(\w+)``", allowed_part))
    return out


def _violations() -> list[str]:
    rules = _rules()
    out = []
    for module, targets in _graph().items():
        room = _room(module)
        allowed = rules.get(room)
        for target in sorted(targets):
            other = _room(target)
            if other in (room, "bbrlab") or allowed is None and other != "cli":
                continue  # its own room; the package's face (its version); the top may take any room
            if allowed is None or other not in allowed:
                out.append(f"{module} -> {target}")
    return out


def test_every_room_states_its_rule():
    assert {room: _rule_text(room)[:40] for room in _rules() if not _rule_text(room)} == {}


def test_every_room_imports_only_what_its_rule_allows():
    assert _violations() == []


def test_the_rules_are_layers():
    """No room allows a room that (through the rules) allows it back: the rooms stack, floor by floor."""
    rules = {room: allowed or set() for room, allowed in _rules().items() if allowed is not None}
    graph = {room: {f"bbrlab.{r}" for r in allowed} for room, allowed in rules.items()}
    assert _circles({f"bbrlab.{room}": targets for room, targets in graph.items()}) == []


def test_the_readmes_step_table_names_every_room():
    """Each room of the house appears in the module column of the README's table of steps."""
    readme = (ROOT.parent / "README.md").read_text()
    table = readme.split("## What the toolkit does, step by step")[1].split("\n\n")[1]
    named = {m.split(".")[1] for m in re.findall(r"`(bbrlab\.\w+)", table) if "." in m}
    rooms = {_room(m) for m in _modules()} - {"bbrlab"}
    assert rooms - named == set()
