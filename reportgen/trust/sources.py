"""Which source files a run's code came from, their SHA-256, and the git state around them.

The foundation layer for provenance (imports only reportgen.files): the plain-twin cache
(:mod:`reportgen.training.cache`) keys its entries on these digests, and the run metadata
(:mod:`reportgen.report.metadata`) signs them.

"User source" means every module in ``sys.modules`` whose file lies outside the standard
library and outside every site-packages/dist-packages folder, whatever the package layout: a
namespace package without ``__init__.py``, a library imported from another folder through
``PYTHONPATH``, an editable install. reportgen's own package is left out of that list (it is
hashed as a whole by :func:`reportgen_sources_sha256`). Libraries installed in site-packages
are covered by their versions, not their files.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from reportgen.files import sha256_bytes, sha256_file, special_kind

#: reportgen's own package folder (left out of the user sources; hashed as a whole).
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # reportgen/, this module being reportgen/trust/sources.py
#: Folder names whose files belong to installed libraries (versioned, not hashed).
LIBRARY_FOLDER_NAMES = ("site-packages", "dist-packages")
#: Seconds one git call may take before the repository's state is reported as unknown.
GIT_TIMEOUT_S = 10


def canonical_sha256(value) -> str:
    """Hex SHA-256 of ``value`` as canonical JSON (sorted keys, no spaces; non-JSON values by ``str``)."""
    return sha256_bytes(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str))


def library_roots() -> tuple[Path, ...]:
    """Folders holding the standard library and installed libraries (resolved), for this interpreter
    and the base interpreter of a virtual environment."""
    roots: set[str] = set()
    for base in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=base) if base else sysconfig.get_paths()
        roots |= {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    try:
        roots |= set(site.getsitepackages())
    except AttributeError:  # old virtualenv's site module
        pass
    user_site = getattr(site, "getusersitepackages", lambda: "")()
    if user_site:
        roots.add(user_site)
    return tuple(sorted({Path(r).resolve() for r in roots}))


def _module_file(module) -> Path | None:
    """The resolved source file of a loaded module, or None (builtins, frozen, namespace roots)."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path:
        return None
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError):
        return None
    return resolved if resolved.is_file() else None


def is_library_file(path: Path, roots: tuple[Path, ...]) -> bool:
    """True when ``path`` is part of the standard library or an installed library."""
    if any(part in LIBRARY_FOLDER_NAMES for part in path.parts):
        return True
    return any(path.is_relative_to(root) for root in roots)


#: ``__file__`` strings of loaded modules that resolved into reportgen's package, the standard library or
#: site-packages: never user source. The run's metadata and every plain-run cache key and entry list the user
#: sources again (several times a run, more in a sweep's jobs); only the few user files are resolved again.
_NOT_USER_FILES: set[str] = set()


def user_source_files(modules: dict | None = None) -> list[Path]:
    """Source files of every loaded module of ``modules`` (default ``sys.modules``, read after the model and task
    were built so that everything they imported is in it) outside the standard library, site-packages and
    reportgen: resolved paths, sorted, without duplicates."""
    roots = library_roots()
    files = set()
    for module in list((sys.modules if modules is None else modules).values()):
        name = getattr(module, "__file__", None)
        if name in _NOT_USER_FILES:  # resolved once per process: ~2000 modules cost ~75 ms of path syscalls
            continue
        path = _module_file(module)
        if path is None or not isinstance(name, str):
            continue
        if path.is_relative_to(PACKAGE_DIR) or is_library_file(path, roots):
            _NOT_USER_FILES.add(name)
        else:
            files.add(path)  # user files are resolved again on every call (an edit, a moved file)
    return sorted(files)


def digest_files(files) -> dict[str, str]:
    """``{absolute path: hex SHA-256}`` of each readable file (an unreadable one maps to ``"unreadable"``)."""
    out = {}
    for path in files:
        try:
            out[str(path)] = sha256_file(path)
        except OSError:
            out[str(path)] = "unreadable"
    return out


def user_source_digests(modules: dict | None = None) -> dict[str, str]:
    """``{absolute path: hex SHA-256}`` of :func:`user_source_files`."""
    return digest_files(user_source_files(modules))


def reportgen_sources_sha256() -> str:
    """One hex SHA-256 over every ``.py`` file of reportgen's package (relative path and digest)."""
    files = sorted(PACKAGE_DIR.rglob("*.py"))
    return canonical_sha256({str(f.relative_to(PACKAGE_DIR)): sha256_file(f) for f in files})


def display_path(path: Path | str, cwd: Path | None = None) -> str:
    """``path`` relative to ``cwd`` (default: the working folder) when it lies inside it, else absolute."""
    path, cwd = Path(path), Path.cwd() if cwd is None else Path(cwd)
    try:
        return str(path.resolve().relative_to(cwd.resolve())) or "."
    except ValueError:
        return str(path)


def _git(folder: Path, *args: str) -> str | None:
    """stdout of ``git -C folder ARGS`` stripped, or None (no git, not a repository, an error, a timeout)."""
    try:
        proc = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_repositories(files) -> list[dict]:
    """The git repository around each file: top folder, commit and whether its tree is dirty.

    A file outside any repository (or with git not installed) is listed under a
    ``{"repository": None}`` entry. ``dirty`` is True when ``git status --porcelain`` lists
    anything (edited, staged or untracked files), None when git could not tell.

    Returns:
        ``[{"repository", "commit", "dirty", "files"}]``, one per repository, sorted by folder;
        ``files`` counts the given files inside it.
    """
    by_folder: dict[Path, str | None] = {}
    repos: dict[str | None, int] = {}
    for path in files:
        folder = Path(path).parent
        if folder not in by_folder:
            by_folder[folder] = _git(folder, "rev-parse", "--show-toplevel")
        top = by_folder[folder]
        repos[top] = repos.get(top, 0) + 1
    out: list[dict[str, Any]] = []
    for top in sorted(repos, key=lambda t: (t is None, t or "")):
        if top is None:
            out.append({"repository": None, "commit": None, "dirty": None, "files": repos[top]})
            continue
        status = _git(Path(top), "status", "--porcelain")
        out.append(
            {
                "repository": top,
                "commit": _git(Path(top), "rev-parse", "HEAD"),
                "dirty": None if status is None else bool(status),
                "files": repos[top],
            }
        )
    return out


def pythonpath_entries(environ: dict | None = None) -> list[str]:
    """The ``PYTHONPATH`` folders of this process (empty entries dropped), in order."""
    value = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    return [p for p in value.split(os.pathsep) if p]


def named_paths(config) -> list[Path]:
    """Every existing file or folder a config value names (``model.config``, ``model.pretrained``,
    ``task.text_file``, a data file of a user's task: any string that is a path on disk), sorted.

    Args:
        config: plain data (dicts, lists, scalars), e.g. the composed config as a container.
    """
    found: set[Path] = set()

    def walk(node) -> None:
        if isinstance(node, (dict, list, tuple)):
            for value in node.values() if isinstance(node, dict) else node:
                walk(value)
        elif isinstance(node, str) and node and "\n" not in node and len(node) < 4096:
            path = Path(node).expanduser()
            try:
                if path.exists():
                    found.add(path.resolve())
            except OSError:
                pass

    walk(config)
    return sorted(found)


def named_file_digests(config) -> dict[str, str]:
    """``{absolute path: hex SHA-256}`` of every file :func:`named_paths` finds; a folder counts as
    every regular file under it (``from_pretrained`` folders: config, weights, tokenizer files).
    A file that cannot be read maps to ``"unreadable"``; devices and FIFOs to their kind."""
    files: list[Path] = []
    for path in named_paths(config):
        files += sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return {str(path): special_kind(path) or digest_files([path])[str(path)] for path in files}
