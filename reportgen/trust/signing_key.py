"""The key a run (or a sweep summary, a comparison) signs with, found before any model work."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.errors import UsageError
from reportgen.trust.keys import GENERATE_COMMAND, KeyFileError, default_key_path, fingerprint, load_private_key


class SigningError(UsageError):
    """Signing cannot proceed (no key, unreadable key); the message says how to fix it."""


@dataclass(frozen=True)
class SigningKey:
    """The private key a run signs with, and where it came from.

    Attributes:
        private_key: ECDSA P-256 private key (never written into the run folder).
        path: the private key file.
        fingerprint: SHA-256 of the public key's DER SubjectPublicKeyInfo, hex.
    """

    private_key: ec.EllipticCurvePrivateKey
    path: Path
    fingerprint: str

    @property
    def public_key(self) -> ec.EllipticCurvePublicKey:
        """The matching public key."""
        return self.private_key.public_key()


def load_signing_key(sign: bool, key_path: str | None = None) -> SigningKey | None:
    """The key to sign with, found before any model work so a missing key stops the run early.

    Args:
        sign: ``report.sign``; ``False`` returns ``None`` (the report says UNSIGNED).
        key_path: ``report.key_path``; ``None`` falls back to ``$REPORTGEN_SIGNING_KEY``, then
            ``~/.config/reportgen/signing-key.pem`` (see :mod:`reportgen.trust.keys`).

    Returns:
        The signing key, or ``None`` when signing is off.

    Raises:
        SigningError: signing is on and the key is missing or unusable; the message names
            ``python -m reportgen.keys generate`` and ``report.sign=false``.
    """
    if not sign:
        return None
    path, source = default_key_path(key_path)
    if not path.exists():
        command = GENERATE_COMMAND if source == "default location" else f"{GENERATE_COMMAND} --out {path}"
        raise SigningError(
            f"signing is on but there is no private key at {path} ({source}). "
            f"Create one with `{command}`, or run with report.sign=false for an UNSIGNED report"
        )
    try:
        private_key = load_private_key(path)
    except KeyFileError as exc:
        raise SigningError(f"{exc} ({source}); or run with report.sign=false for an UNSIGNED report") from None
    return SigningKey(private_key, path, fingerprint(private_key.public_key()))


def signature_label(key: SigningKey | None) -> str:
    """What page 1 shows in its "Signed by" row: ``sha256:<hex>``, or ``""`` for UNSIGNED."""
    return f"sha256:{key.fingerprint}" if key else ""
