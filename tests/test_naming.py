"""Activation recomputation is a memory optimisation, not a saved training state: no name that
reportgen defines (code identifiers, config keys) says a bare ``checkpoint`` that an operator could
take for recovery protection (DESIGN.md "What it is for"). Names of torch's own API are allowed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: torch's names (torch.utils.checkpoint, torch.distributed.algorithms._checkpoint), and ours that
#: name the torch function they feed.
TORCH_API = {
    "CheckpointImpl",
    "CheckpointWrapper",
    "checkpoint_wrapper",
    "CheckpointPolicy",
    "CheckpointError",
    "create_selective_checkpoint_contexts",
    "checkpoint_fn",
    "checkpoint_kwargs",
    "_CHECKPOINT_PREFIX",
    "apply_activation_checkpointing",
}
BARE = re.compile(r"checkpoint", re.IGNORECASE)
QUALIFIED = re.compile(r"(activation|gradient)_?checkpoint", re.IGNORECASE)


def defined_names(tree: ast.AST) -> list[str]:
    """Identifiers a module defines: functions, classes, assigned names and attributes, arguments, import aliases."""
    names = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.append(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
            names.append(n.attr)
        elif isinstance(n, ast.arg):
            names.append(n.arg)
        elif isinstance(n, ast.alias):
            names.append(n.asname or n.name.split(".")[-1])
    return names


def bare(name: str) -> bool:
    """True when ``name`` says checkpoint without saying activation/gradient and is not torch's."""
    return name not in TORCH_API and bool(BARE.search(QUALIFIED.sub("", name)))


def yaml_keys(obj) -> list[str]:
    if isinstance(obj, dict):
        return [str(k) for k in obj] + [k for v in obj.values() for k in yaml_keys(v)]
    if isinstance(obj, list):
        return [k for v in obj for k in yaml_keys(v)]
    return []


def test_no_code_name_says_a_bare_checkpoint():
    found = [
        f"{p.relative_to(ROOT)}: {n}"
        for p in (ROOT / "reportgen").rglob("*.py")
        for n in defined_names(ast.parse(p.read_text()))
        if bare(n)
    ]
    assert found == []


def test_no_config_key_says_a_bare_checkpoint():
    found = [
        f"{p.relative_to(ROOT)}: {k}"
        for p in (ROOT / "conf").rglob("*.yaml")
        for k in yaml_keys(yaml.safe_load(p.read_text()) or {})
        if bare(k)
    ]
    assert found == []


def test_the_rule_catches_a_bare_name():
    """The check itself: it flags what it must and passes what it may."""
    names = defined_names(ast.parse("def save_checkpoint(checkpoint_dir): pass\nactivation_checkpointing = 1"))
    assert [n for n in names if bare(n)] == ["save_checkpoint", "checkpoint_dir"]
