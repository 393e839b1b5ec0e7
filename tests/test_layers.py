"""Imports point down: every module sits in a layer and imports only its own layer or lower,
also inside functions and under ``TYPE_CHECKING`` (STYLE.md 12, docs/architecture.md "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "reportgen"

#: Lowest first: one row per package (docs/architecture.md "Layers" lists the same rows; a test
#: checks they agree). A module belongs to the row of the longest package prefix that names it;
#: root modules are named one by one.
LAYERS: list[tuple[str, set[str]]] = [
    (
        "foundation",
        {
            "reportgen",
            "paths",
            "files",
            "errors",
            "config",
            "structure",
            "rng",
            "limits",
            "threads",
            "progress",
            "models.ffn",
            "models.mlp",
            "models.gpt",
            "models",
        },
    ),
    ("results", {"results"}),
    ("trust", {"trust"}),
    ("tasks", {"tasks"}),
    ("twins", {"twins"}),
    ("models.hf", {"models.hf"}),
    ("memory", {"memory"}),
    ("training", {"training"}),
    ("distributed", {"distributed"}),
    ("checks", {"checks"}),
    ("claim", {"claim"}),
    ("commands", {"commands"}),
    ("report", {"report"}),
    ("ci", {"ci"}),
    ("sweep", {"sweep"}),
    ("compare.derive", {"compare", "compare.derive"}),
    ("verify", {"verify"}),
    ("pipeline", {"run", "compare.command", "plan", "trust.finish"}),
    ("entry", {"cli", "__main__", "keys", "sign", "compare.__main__", "sweep.__main__", "verify.__main__"}),
]


def _modules() -> dict[str, Path]:
    """``{dotted name relative to reportgen ('' for the package): file}``."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        found[".".join(parts) or "reportgen"] = path
    return found


MODULES = _modules()


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


def _row(name: str) -> str | None:
    """The LAYERS member naming ``name``: itself, else its longest package prefix; None if unplaced."""
    members = set().union(*(m for _, m in LAYERS))
    parts = name.split(".")
    return next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in members), None)


def _layer(name: str) -> int:
    row = _row(name)
    return next(i for i, (_, members) in enumerate(LAYERS) if row in members)


def test_every_module_has_a_layer():
    placed = set().union(*(members for _, members in LAYERS))
    assert sorted(n for n in MODULES if _row(n) is None) == [], "place the new module in LAYERS (tests/test_layers.py)"
    assert sorted(placed - set(MODULES)) == [], "LAYERS names a module that no longer exists"


def test_only_foundation_entry_points_and_tasks_stand_at_the_root():
    """Every other module lives in the folder of its concern (STYLE.md 14)."""
    root = {n for n in MODULES if "." not in n and not (PACKAGE / n).is_dir()}
    allowed = LAYERS[0][1] | {"tasks", "run", "cli", "__main__", "keys", "sign"}
    assert sorted(root - allowed) == []


def test_no_module_over_400_lines():
    """STYLE.md 12: a module past ~400 lines is usually two rooms."""
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: k for n, k in long.items() if k > 400 and n not in TOO_LONG_STILL} == {}


#: Modules still over 400 lines, to be split (each named so that none is added silently).
TOO_LONG_STILL: set[str] = set()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    upward = sorted(
        f"{target} ({LAYERS[_layer(target)][0]})"
        for target in _imports(name)
        if target in MODULES and _layer(target) > _layer(name)
    )
    assert upward == [], f"{name} ({LAYERS[_layer(name)][0]}) imports from a layer above it: {upward}"


def test_no_import_circle():
    graph = {name: _imports(name) for name in MODULES}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(nxt) :] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_walker_sees_imports_inside_functions(tmp_path):
    """The check itself: a function-level import is found (a walker that missed it could not fail)."""
    assert "cli" in _imports("__main__") and "checks.base" in _imports("checks.memory")
    assert "twins.setup" in _imports("memory.saved")  # under TYPE_CHECKING only, and still counted


def test_architecture_doc_has_the_same_layers():
    """docs/architecture.md's "Folders and layers" table lists exactly LAYERS, row by row, in order."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = doc.split("## Folders and layers")[1].split("\n\n")[2]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    documented = [(layer.strip(), {m.strip(" `") for m in members.split(",")}) for layer, members in rows]
    assert documented == LAYERS
