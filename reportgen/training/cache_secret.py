"""The cache secret: the key of every cache entry's HMAC (:mod:`reportgen.training.cache`); like the signing
key it must be the user's own private file."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

from reportgen.files import special_kind

#: Names the file holding the cache secret (default ``~/.config/reportgen/cache-secret``).
SECRET_ENV = "REPORTGEN_CACHE_SECRET"
#: Bytes of a new cache secret; a shorter file is refused.
SECRET_BYTES = 32


def secret_path() -> Path:
    """Where the cache secret is: ``$REPORTGEN_CACHE_SECRET``, else ``~/.config/reportgen/cache-secret``."""
    configured = os.environ.get(SECRET_ENV, "").strip()
    return Path(configured or "~/.config/reportgen/cache-secret").expanduser()


def cache_secret() -> bytes:
    """The key of every entry's HMAC: the bytes of :func:`secret_path`, made on first use
    (:data:`SECRET_BYTES` random bytes, mode 0600; two jobs making it at once agree on one).

    Raises:
        OSError: the file cannot be read or made, or holds fewer than 16 bytes.
        CacheSecretError: it is not the user's own 0600 regular file (:func:`check_secret_file`).
    """
    path = secret_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(SECRET_BYTES))
            os.link(tmp, path)  # atomic: fails when another job made it first
        except FileExistsError:
            pass
        finally:
            Path(tmp).unlink(missing_ok=True)
    check_secret_file(path)
    data = path.read_bytes()
    if len(data) < 16:
        raise OSError(
            f"the cache secret {path} holds {len(data)} bytes (at least 16 needed); delete it and a new one is made"
        )
    return data


class CacheSecretError(OSError):
    """The cache secret is not the user's own private file; the message names the fix (``chmod 600``)."""


def check_secret_file(path: Path) -> None:
    """The cache secret must be a regular file of this user with mode 0600, like the signing key:
    whoever can read it can write cache entries whose HMAC verifies.

    Raises:
        CacheSecretError: a device or FIFO, another user's file, or readable/writable by others.
    """
    kind = special_kind(path)
    if kind:
        raise CacheSecretError(
            f"the cache secret {path} is {kind}, not a regular file; point "
            f"{SECRET_ENV} at a file of your own (mode 0600), or unset it"
        )
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CacheSecretError(
            f"the cache secret {path} belongs to another user (uid {info.st_uid}); it must be "
            f"your own file (mode 0600): point {SECRET_ENV} at one, or unset it"
        )
    mode = info.st_mode & 0o777
    if mode & 0o077:
        raise CacheSecretError(
            f"the cache secret {path} is accessible by others (mode {mode:04o}): anyone who can "
            f"read it can write cache entries reportgen accepts. Run `chmod 600 {path}` (and delete "
            "the cache folder if others may have read it)"
        )
