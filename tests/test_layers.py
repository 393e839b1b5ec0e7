"""Imports point down: every module sits in a layer and imports only its own layer or lower,
also inside functions and under ``TYPE_CHECKING`` (STYLE.md 12, docs/architecture.md "Layers")."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "reportgen"

#: Lowest first. A new module must be placed here, in the layer its imports allow.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation", {"reportgen", "paths", "files", "errors", "config", "distance", "rounding", "rng", "structure", "keys",
                    "fetcher", "cache", "attachments", "sources", "limits", "bootstrap", "models", "models.ffn",
                    "models.mlp", "models.gpt", "threads", "progress", "dist_settings"}),
    ("core", {"results", "recompute", "tasks"}),
    ("twins", {"setup", "train", "rows", "measure", "peak", "snapshot", "estimate", "hf", "hf_auto", "hf_masked", "contract", "plots", "diagnose_distributed", "diagnose",
               "duration", "distributed", "wrapping", "rank_sync", "ranks", "sharded_budget"}),
    ("checks", {"checks.base", "checks.parity", "checks.step", "checks.trajectory", "checks.policy",
                "checks.memory", "checks.timing", "checks.budget", "checks.larger_batch", "checks.distributed"}),
    ("registry", {"checks", "validation", "render_guard", "metadata"}),
    ("outputs", {"render", "signing", "rundir"}),
    ("verify", {"sweep", "comparison", "verify.outcome", "verify.pdf", "verify.common", "verify.run", "verify.sweep", "verify.comparison", "verify",
                "verify.__main__"}),
    ("pipeline", {"run", "compare", "plan"}),
    ("entry", {"cli", "__main__"}),
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
            candidates = [a.name.removeprefix("reportgen").lstrip(".") for a in node.names if a.name.startswith("reportgen")]
        else:
            continue
        found |= {(c or "reportgen") for c in candidates if (c or "reportgen") in MODULES}
    return found - {name}


def _layer(name: str) -> int:
    return next(i for i, (_, members) in enumerate(LAYERS) if name in members)


def test_every_module_has_a_layer():
    placed = set().union(*(members for _, members in LAYERS))
    assert sorted(set(MODULES) - placed) == [], "place the new module in LAYERS (tests/test_layers.py)"
    assert sorted(placed - set(MODULES)) == [], "LAYERS names a module that no longer exists"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    upward = sorted(f"{target} ({LAYERS[_layer(target)][0]})" for target in _imports(name)
                    if target in MODULES and _layer(target) > _layer(name))
    assert upward == [], f"{name} ({LAYERS[_layer(name)][0]}) imports from a layer above it: {upward}"


def test_no_import_circle():
    graph = {name: _imports(name) for name in MODULES}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_walker_sees_imports_inside_functions(tmp_path):
    """The check itself: a function-level import is found (a walker that missed it could not fail)."""
    assert "cli" in _imports("__main__") and "checks.base" in _imports("checks.memory")
    assert "setup" in _imports("measure")  # under TYPE_CHECKING only, and still counted
