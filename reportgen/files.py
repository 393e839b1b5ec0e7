"""Output files, the lowest layer: file modes, atomic writes, digests, and write failures named.

Every module that writes a run's files imports from here; this module imports nothing of
reportgen's, so any layer may use it (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path


class OutputWriteError(OSError):
    """A file could not be written (disk full, read-only folder, permission denied).

    The message is one line, ``could not write PATH: REASON (the fix)``; the pipeline turns it
    into exit 2, never "a bug in reportgen".
    """


#: The fix to name per errno of a failed write.
_WRITE_FIXES = {
    errno.ENOSPC: "the disk is full; free space or point hydra.run.dir at another disk",
    errno.EDQUOT: "the disk quota is used up; free space or point hydra.run.dir at another disk",
    errno.EROFS: "the file system is read-only; point hydra.run.dir at a writable folder",
    errno.EACCES: "permission denied; point hydra.run.dir at a folder you can write to",
    errno.EPERM: "permission denied; point hydra.run.dir at a folder you can write to",
}
#: The errnos of a failed write that are the user's to fix (a full disk, a read-only folder, no permission).
WRITE_ERRNOS = frozenset(_WRITE_FIXES)


def write_failure(path: Path, exc: OSError) -> OutputWriteError:
    """The :class:`OutputWriteError` naming ``path``, the system's reason and the fix."""
    fix = _WRITE_FIXES.get(exc.errno or 0, "check that the folder exists and is writable")
    error = OutputWriteError(f"could not write {path}: {exc.strerror or exc} ({fix})")
    error.errno = exc.errno
    return error


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (``/proc/self/status``).

    Returns:
        The umask bits, e.g. ``0o022``.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no getter elsewhere: set and restore at once
    os.umask(mask)
    return mask


def output_file_mode() -> int:
    """Mode of a new output file: ``0o666`` less the umask, as ``open()`` would create it.

    ``tempfile.mkstemp`` (used for atomic writes) always creates mode 0600; outputs are
    reports meant to be shared, so they get the mode the user's umask asks for, the same
    as Hydra's ``.hydra/*.yaml`` beside them (0644 under the usual umask 022, 0600 under 077).
    """
    return 0o666 & ~current_umask()


def atomic_write(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to the new file ``path`` via a temporary file and ``os.replace`` (no torn files).

    Raises:
        FileExistsError: ``path`` exists already; outputs never overwrite an earlier run.
        OutputWriteError: the file system refused the write (disk full, read-only, permissions);
            nothing is left half-written.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists already; reportgen never overwrites an earlier run")
    _write_then_rename(path, data)
    record_written(path)
    return path


def _write_then_rename(path: Path, data: bytes | str) -> None:
    """``data`` into a temporary file beside ``path``, then ``os.replace`` onto it: what ``path`` held stays
    whole until the new bytes are all written (a full disk mid-write leaves the old file as it was).

    Raises:
        OutputWriteError: the temporary file could not be made, written or renamed; it is removed.
    """
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise write_failure(path, exc) from exc
    try:
        os.fchmod(fd, output_file_mode())  # mkstemp makes 0600; outputs follow the umask
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise write_failure(path, exc) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


#: Folders whose files this process writes are listed, as it goes, in the folder's manifest
#: (``reportgen.trust.manifest``): ``{absolute folder: manifest file name}``.
_MANIFESTS: dict[Path, str] = {}
_LISTED: dict[Path, set[str]] = {}


def track_writes(folder: Path, manifest_name: str) -> None:
    """From now on, every :func:`atomic_write` under ``folder`` appends its path (relative, POSIX)
    to ``folder/manifest_name``, one line per file, flushed at once."""
    _MANIFESTS[Path(folder).absolute()] = manifest_name
    _LISTED[Path(folder).absolute()] = set()


def record_written(path: Path) -> None:
    """Add ``path`` to the manifest of the tracked folder it lies in (if any): a file this process wrote,
    or renamed into place. The manifest is rewritten whole (its lines so far, then this one) through a
    temporary file, so a full disk never leaves it torn or shorter.

    Raises:
        OutputWriteError: the manifest could not be rewritten (it stays as it was).
    """
    path = Path(path).absolute()
    for folder, name in _MANIFESTS.items():
        relative = path.relative_to(folder).as_posix() if path.is_relative_to(folder) else None
        if relative is not None and path.name != name and relative not in _LISTED[folder]:
            manifest = folder / name
            try:
                listed = manifest.read_text(encoding="utf-8") if manifest.is_file() else ""
            except OSError as exc:
                raise write_failure(manifest, exc) from exc
            _write_then_rename(
                manifest, listed + ("" if not listed or listed.endswith("\n") else "\n") + relative + "\n"
            )
            _LISTED[folder].add(relative)


def replace_write(path: Path, data: bytes | str) -> Path:
    """Atomically (re)write a file this run owns, e.g. the partial frame after each check: the new bytes go to
    a temporary file that ``os.replace`` renames onto ``path``, so the file is never removed first and a write
    that fails (a full disk) leaves the previous version whole.

    Raises:
        OutputWriteError: the file system refused the write; ``path`` is as it was.
    """
    path = Path(path)
    _write_then_rename(path, data)
    record_written(path)
    return path


def sha256_file(path: Path) -> str:
    """SHA-256 of a file's bytes, hex.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_bytes(data: bytes | str) -> str:
    """SHA-256 of bytes (a str is UTF-8 encoded first), hex."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


class NotRegularFile(OSError):
    """A path that must be a file (or folder) is a device, FIFO or socket: reading it would never end."""


def special_kind(path: Path) -> str | None:
    """What ``path`` is when it exists and is neither a regular file nor a folder (``None`` otherwise).

    Returns:
        ``"a character device"``, ``"a block device"``, ``"a FIFO (named pipe)"``, ``"a socket"``.
    """
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    kinds = (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), None)


def refuse_special(path: Path) -> None:
    """Refuse, in one line, a path that is a device, FIFO or socket (``/dev/zero``, ``mkfifo``).

    Raises:
        NotRegularFile: ``path`` is one; the message names it and what to pass instead.
    """
    kind = special_kind(Path(path))
    if kind:
        raise NotRegularFile(f"{path} is {kind}, not a regular file; pass the file itself")
