"""Imports point down: every folder of reportgen/ is a layer, and every module imports only from its own
folder or a lower one, also inside functions and under ``TYPE_CHECKING`` (STYLE.md 12, docs/architecture.md
"Folders and layers"); the folders import one another without a circle.

An entry point stands above every layer: a module named ``__main__``, or a module that defines no
function or class and only runs an ``if __name__ == "__main__":`` guard (``reportgen/sign.py``,
``reportgen/keys.py``). It may import only ``reportgen.commands`` or the module that defines the
command it runs, and belongs to no layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "reportgen"

#: Lowest first: one row per folder of reportgen/ (the folder a module's file is in; a subfolder is a row
#: of its own), no exceptions. docs/architecture.md "Folders and layers" lists the same rows in the same
#: order (a test checks they agree).
LAYERS: list[str] = [
    "reportgen",
    "reportgen/models",
    "reportgen/results",
    "reportgen/trust",
    "reportgen/twins",
    "reportgen/models/hf",
    "reportgen/memory",
    "reportgen/training",
    "reportgen/distributed",
    "reportgen/checks/base",
    "reportgen/checks/parity",
    "reportgen/checks/memory",
    "reportgen/checks/timing",
    "reportgen/checks/distributed",
    "reportgen/checks/controls",
    "reportgen/checks",
    "reportgen/claim",
    "reportgen/report",
    "reportgen/ci",
    "reportgen/sweep",
    "reportgen/compare",
    "reportgen/verify",
    "reportgen/plan",
    "reportgen/commands",
]

#: The root folder's own modules besides entry points: what every layer may use (STYLE.md 14).
FOUNDATION = {
    "reportgen",
    "paths",
    "files",
    "errors",
    "library_warnings",
    "config",
    "structure",
    "rng",
    "limits",
    "threads",
    "progress",
    "tasks",
}


def _modules() -> dict[str, Path]:
    """``{dotted name relative to reportgen ('reportgen' for the package): file}``."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        found[".".join(parts) or "reportgen"] = path
    return found


MODULES = _modules()


def _folder(name: str) -> str:
    """The folder ``name``'s file is in, as LAYERS writes it (``reportgen/models/hf``)."""
    return MODULES[name].parent.relative_to(PACKAGE.parent).as_posix()


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``."""
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and len(node.test.comparators) == 1
        and isinstance(node.test.comparators[0], ast.Constant)
        and node.test.comparators[0].value == "__main__"
    )


def _thin(name: str) -> bool:
    """The file defines no function or class and holds only its docstring, imports and a ``__main__`` guard."""
    tree = ast.parse(MODULES[name].read_text())
    defines = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree))
    docstring = [tree.body[0]] if ast.get_docstring(tree) is not None else []
    rest = [n for n in tree.body if n not in docstring and not isinstance(n, (ast.Import, ast.ImportFrom))]
    return not defines and len(rest) == 1 and _is_main_guard(rest[0])


def _is_entry(name: str) -> bool:
    """An entry point (module docstring): named ``__main__``, or thin (:func:`_thin`)."""
    return name.split(".")[-1] == "__main__" or _thin(name)


ENTRIES = {n for n in MODULES if _is_entry(n)}


def _imports(name: str) -> set[str]:
    """Modules of reportgen that ``name`` imports anywhere in its file (function bodies included)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" and name != "reportgen" else name.split(".")[:-1]
    if name == "reportgen":
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("reportgen"):
                target = (node.module or "").removeprefix("reportgen").lstrip(".")
            else:
                continue
            candidates = [target] + [f"{target}.{a.name}".lstrip(".") for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [
                a.name.removeprefix("reportgen").lstrip(".") for a in node.names if a.name.startswith("reportgen")
            ]
        else:
            continue
        found |= {(c or "reportgen") for c in candidates if (c or "reportgen") in MODULES}
    return found - {name}


def _layer(name: str) -> int:
    """The row of ``name``'s folder; an entry point stands above every row."""
    return len(LAYERS) if name in ENTRIES else LAYERS.index(_folder(name))


def _layer_name(name: str) -> str:
    return "entry point" if name in ENTRIES else _folder(name)


def test_every_folder_has_a_layer():
    folders = {_folder(n) for n in MODULES if n not in ENTRIES}
    assert sorted(folders - set(LAYERS)) == [], "place the new folder in LAYERS (tests/test_layers.py)"
    assert sorted(set(LAYERS) - folders) == [], "LAYERS names a folder that holds no module any more"
    assert len(LAYERS) == len(set(LAYERS)), "a folder is named twice in LAYERS"


def test_only_foundation_and_entry_points_stand_at_the_root():
    """Every other module lives in the folder of its concern (STYLE.md 14)."""
    root = {n for n in MODULES if _folder(n) == "reportgen"}
    assert sorted(root - FOUNDATION - ENTRIES) == []
    assert sorted(FOUNDATION - root) == [], "FOUNDATION names a module that is not at the root any more"


def test_every_main_module_is_a_thin_entry_point():
    """A ``__main__`` module only imports its command and runs it under a ``__main__`` guard."""
    assert sorted(n for n in MODULES if n.split(".")[-1] == "__main__" and not _thin(n)) == []


def _defines(module: str, name: str) -> bool:
    """``module`` defines ``name`` itself at its top level (a function, a class or an assignment)."""
    for node in ast.parse(MODULES[module].read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_entry_points_import_only_commands_or_the_defining_module(name):
    """An entry point imports from ``reportgen.commands`` or from the module that defines what it imports."""
    wrong = []
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            wrong += [a.name for a in node.names if a.name.startswith("reportgen")]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("reportgen")):
            module = (node.module or "").removeprefix("reportgen").lstrip(".")
            if node.level or not module:
                wrong.append(f"{'.' * node.level}{node.module or ''}")
            elif module != "commands" and not module.startswith("commands."):
                wrong += [f"{module}.{a.name}" for a in node.names if not _defines(module, a.name)]
    assert wrong == [], f"{name} (entry point) imports what it should take from reportgen.commands: {wrong}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    upward = sorted(
        f"{target} ({_layer_name(target)})"
        for target in _imports(name)
        if target in MODULES and _layer(target) > _layer(name)
    )
    assert upward == [], f"{name} ({_layer_name(name)}) imports from a layer above it: {upward}"


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` (``[a, b, a]``), or ``[]`` when it has none."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return []

    for name in sorted(graph):
        if name not in state and (found := visit(name, [name])):
            return found
    return []


def test_no_import_circle():
    circle = _circle({name: _imports(name) for name in MODULES})
    assert circle == [], "import circle: " + " -> ".join(circle)


def test_no_folder_cycle():
    """The folders' import graph (entry points left out: they stand above every folder) has no circle."""
    graph: dict[str, set[str]] = {_folder(n): set() for n in MODULES if n not in ENTRIES}
    for name in MODULES.keys() - ENTRIES:
        graph[_folder(name)] |= {_folder(t) for t in _imports(name) - ENTRIES} - {_folder(name)}
    circle = _circle(graph)
    assert circle == [], "folder import circle: " + " -> ".join(circle)


def test_the_walker_sees_imports_inside_functions(tmp_path):
    """The check itself: a function-level import is found (a walker that missed it could not fail)."""
    assert "commands.run" in _imports("commands.cli") and "checks.base" in _imports("checks.memory.check")
    assert "twins.setup" in _imports("memory.saved")  # under TYPE_CHECKING only, and still counted


def test_architecture_doc_has_the_same_layers():
    """docs/architecture.md's "Folders and layers" table lists exactly LAYERS, row by row, in order."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    section = doc.split("## Folders and layers")[1].split("\n## ")[0]
    table = next(block for block in section.split("\n\n") if block.startswith("| folder |"))
    documented = [line.split("|")[1].strip(" `").rstrip("/") for line in table.splitlines()[2:]]
    assert documented == LAYERS


def test_the_entry_rule_finds_the_entry_points():
    """The rule itself: the root's ``sign``/``keys`` and every ``__main__`` are entry points; a command is not."""
    assert {"__main__", "sign", "keys", "compare.__main__", "plan.__main__"} <= ENTRIES
    assert not ENTRIES & {"commands.cli", "commands.sign", "trust.keys", "verify", "paths"}
