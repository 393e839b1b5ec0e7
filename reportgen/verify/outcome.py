"""One verification line (:class:`Check`), and the helpers every verifier of ``reportgen.verify`` builds its
lines with (the lowest module of the package)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from reportgen.trust.attachments import AttachmentError

PASS, FAIL, NOTE = "PASS", "FAIL", "NOTE"
T = TypeVar("T")


@dataclass
class Check:
    """One verification outcome: ``status`` is PASS, FAIL or NOTE (NOTE never fails)."""

    status: str
    name: str
    detail: str = ""

    @property
    def line(self) -> str:
        """``PASS name (detail)`` / ``FAIL name: detail`` on one line."""
        detail = " ".join(self.detail.split())
        if not detail:
            return f"{self.status} {self.name}"
        return f"{self.status} {self.name}" + (f": {detail}" if self.status == FAIL else f" ({detail})")


def short_digest(hex_digest: str) -> str:
    """``sha256:0123456789abcdef...``: enough digits to compare by eye."""
    return f"sha256:{hex_digest[:16]}..."


def attempt(name: str, fn: Callable[[], str]) -> Check:
    """Run one check; its return value is the PASS detail, any exception a FAIL (one line, no traceback)."""
    try:
        return Check(PASS, name, fn())
    except Exception as exc:  # noqa: BLE001 - tampered input raises anything; every one is a FAIL
        message = str(exc) or type(exc).__name__
        return Check(
            FAIL,
            name,
            message if isinstance(exc, (VerifyError, AttachmentError)) else f"{type(exc).__name__}: {message}",
        )


class VerifyError(Exception):
    """A check found something wrong (its message is the FAIL detail)."""


def require(condition: object, message: str) -> None:
    """Raise :class:`VerifyError` with ``message`` unless ``condition`` is true (truthy).

    It narrows nothing for a type checker; to go on with a value that must be present or of a
    type, take it from :func:`present` or :func:`of_type`, which raise the same way.
    """
    if not condition:
        raise VerifyError(message)


def present(value: T | None, message: str) -> T:
    """``value``, or :class:`VerifyError` with ``message`` when it is ``None``."""
    if value is None:
        raise VerifyError(message)
    return value


def of_type(value: object, kind: type[T], message: str) -> T:
    """``value`` when it is an instance of ``kind`` (e.g. a predicate field that must be a list), else
    :class:`VerifyError` with ``message``."""
    if not isinstance(value, kind):
        raise VerifyError(message)
    return value
