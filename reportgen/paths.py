"""Where the shipped config and templates live, in a clone and in an installed wheel."""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def _find(name: str) -> Path:
    """Return ``reportgen/<name>`` (wheel layout) or ``<repo>/<name>`` (clone layout).

    Raises:
        FileNotFoundError: neither layout has the folder (a broken install).
    """
    for candidate in (_PKG / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"reportgen's {name}/ folder is missing; reinstall with `pip install reportgen`")


def conf_dir() -> Path:
    """Absolute path of the primary Hydra config folder (``conf/``)."""
    return _find("conf")


def templates_dir() -> Path:
    """Absolute path of the jinja2 templates folder (``templates/``)."""
    return _find("templates")


def builtin_models() -> list[str]:
    """Names of the built-in model configs (``conf/model/*.yaml``), sorted."""
    return sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml"))
