"""Files a model or task opens while the plain twin trains, seen through Python's audit hooks.

The cache key (``reportgen.training.cache``) hashes what the config names; a task may also read
a file it finds on its own (a dataset beside its module, a vocabulary file). Python raises the
``open`` audit event (PEP 578) for every ``open()``/``os.open`` in the process, whoever calls it,
so :func:`opened_files` sees those reads too. The cache stores each such file's SHA-256 with the
entry and treats the entry as stale when one has changed: a reused run never stands in for a
run on other data. A file opened through C code that bypasses Python (a library's own ``fopen``)
raises no event and stays invisible; page 1 says what the key covers.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from reportgen.trust.sources import PACKAGE_DIR, is_library_file, library_roots

#: The collectors open right now (nested uses each get every read).
_ACTIVE: list[set[str]] = []
_INSTALLED = False
#: Pseudo file systems and devices: never data.
SKIPPED_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))


def _audit(event: str, args: tuple) -> None:
    """Audit hook: remember the path of every read-only open while a collector is active."""
    if event != "open" or not _ACTIVE:
        return
    path, mode, flags = (tuple(args) + (None, None, None))[:3]
    if isinstance(path, int) or path is None:
        return
    if mode is not None and any(c in str(mode) for c in "wax+"):
        return
    if mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR):
        return
    name = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path)
    for seen in _ACTIVE:
        seen.add(name)


@contextlib.contextmanager
def opened_files(ignore: tuple[Path, ...] = ()) -> Iterator[list[Path]]:
    """Collect the data files opened for reading inside the block.

    Args:
        ignore: folders whose files are not data (the cache folder itself).

    Yields:
        A list, filled when the block ends: resolved regular files outside the standard library,
        installed libraries, reportgen, ``/proc``, ``/sys``, ``/dev`` and ``ignore``, sorted;
        Python sources and bytecode are left out (the user-source digests cover them).
    """
    global _INSTALLED
    if not _INSTALLED:
        sys.addaudithook(_audit)  # process-wide and permanent (PEP 578); idle without a collector
        _INSTALLED = True
    seen: set[str] = set()
    found: list[Path] = []
    _ACTIVE.append(seen)
    try:
        yield found
    finally:
        _ACTIVE.remove(seen)
        roots = library_roots()
        skipped = tuple(Path(p).resolve() for p in (*SKIPPED_ROOTS, PACKAGE_DIR, *ignore))
        paths = set()
        for name in seen:
            try:
                path = Path(name).resolve()
            except (OSError, RuntimeError):
                continue
            code = path.suffix in (".py", ".pyc") or "__pycache__" in path.parts  # sources: their own digests
            if (
                path.is_file()
                and not code
                and not is_library_file(path, roots)
                and not any(path.is_relative_to(s) for s in skipped)
            ):
                paths.add(path)
        found.extend(sorted(paths))
