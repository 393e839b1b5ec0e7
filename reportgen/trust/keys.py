"""Signing keys: generate a pair (``python -m reportgen.keys``), find the private key, load keys, fingerprint them.

One ECDSA P-256 key serves both signatures reportgen makes: the DSSE envelope (securesystemslib
``CryptoSigner``, scheme ``ecdsa-sha2-nistp256``) and the PAdES signature of the PDF (pyHanko, with a
self-signed X.509 certificate for the same key).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.errors import UsageError
from reportgen.files import sha256_bytes, special_kind

#: Environment variable naming the private key when the config does not.
KEY_ENV = "REPORTGEN_SIGNING_KEY"
#: Command that creates a key, quoted in every "no key" message.
GENERATE_COMMAND = "python -m reportgen.keys generate"


class KeyFileError(UsageError):
    """A key file is missing, unreadable, or not a supported key (one-line message)."""


def default_key_path(configured: str | os.PathLike | None = None) -> tuple[Path, str]:
    """Where the private key is, and which rule chose it: ``report.key_path``, else
    ``$REPORTGEN_SIGNING_KEY``, else ``~/.config/reportgen/signing-key.pem``.

    ``configured`` is ``report.key_path`` (``None`` when unset). Returns ``(path, source)``: source is
    ``"report.key_path"``, ``"$REPORTGEN_SIGNING_KEY"`` or ``"default location"``; the path is expanded (``~``)
    but need not exist.
    """
    if configured:
        return Path(configured).expanduser(), "report.key_path"
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV]).expanduser(), f"${KEY_ENV}"
    return Path("~/.config/reportgen/signing-key.pem").expanduser(), "default location"


def public_key_path(private_path: str | os.PathLike) -> Path:
    """The public key written beside a private key: ``signing-key.pem`` → ``signing-key.pub.pem``."""
    private_path = Path(private_path)
    stem = private_path.name[:-4] if private_path.name.endswith(".pem") else private_path.name
    return private_path.with_name(stem + ".pub.pem")


def fingerprint(public_key: ec.EllipticCurvePublicKey) -> str:
    """SHA-256 of the DER SubjectPublicKeyInfo, 64 lowercase hex digits: shown on page 1 and by
    ``reportgen.verify`` (``openssl pkey -pubin -in KEY.pub.pem -outform DER | sha256sum`` prints the same)."""
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return sha256_bytes(der)


def _check_supported(key, path: Path):
    """Return ``key`` when it is an ECDSA P-256 key, else raise :class:`KeyFileError`."""
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) or not isinstance(
        key.curve, ec.SECP256R1
    ):
        kind = getattr(getattr(key, "curve", None), "name", None) or type(key).__name__
        raise KeyFileError(
            f"{path}: unsupported key ({kind}); reportgen signs with ECDSA P-256 keys made by `{GENERATE_COMMAND}`"
        )
    return key


def _read(path: Path) -> bytes:
    """Bytes of a key file, or :class:`KeyFileError` with a one-line reason (a device or FIFO,
    e.g. ``/dev/zero``, is refused before it is read: it would never end)."""
    kind = special_kind(path)
    if kind:
        raise KeyFileError(f"{path} is {kind}, not a key file; pass the PEM file itself")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read key file ({exc.strerror})") from None


def load_private_key(path: str | os.PathLike) -> ec.EllipticCurvePrivateKey:
    """The ECDSA P-256 private key in ``path``, an unencrypted PEM private key (PKCS#8 or SEC1).

    Raises:
        KeyFileError: the file is missing, unreadable, encrypted, not a PEM private key,
            readable or writable by group or others (mode & 0o077), or not ECDSA P-256.
    """
    path = Path(path)
    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyFileError(
            f"{path}: the key is encrypted; reportgen needs an unencrypted key "
            "(protect it with file permissions, mode 0600)"
        ) from None
    except ValueError:
        raise KeyFileError(f"{path}: not a PEM private key") from None
    key = _check_supported(key, path)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:  # as ssh does
        raise KeyFileError(
            f"{path}: the private key is accessible by others (mode {mode:04o}); anyone who can "
            f"read it can sign reports as you. Run `chmod 600 {path}` (and make a new key with "
            f"`{GENERATE_COMMAND}` if others may have read it)"
        )
    return key


def load_public_key(path: str | os.PathLike) -> ec.EllipticCurvePublicKey:
    """The ECDSA P-256 public key in ``path`` (e.g. ``signing-key.pub.pem``), a PEM public key
    (``-----BEGIN PUBLIC KEY-----``), as reviewers receive it.

    Raises:
        KeyFileError: the file is missing, unreadable, not a PEM public key (a private key is
            refused: reviewers must never need it), or not ECDSA P-256.
    """
    path = Path(path)
    data = _read(path)
    if b"PRIVATE KEY" in data:
        raise KeyFileError(f"{path}: this is a private key; pass the public key ({public_key_path(path).name})")
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise KeyFileError(f"{path}: not a PEM public key") from None
    return _check_supported(key, path)


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
    """The key to sign with, found before any model work so a missing key stops the run early; ``None`` when
    signing is off (``sign``, ``report.sign``, is False: the report says UNSIGNED). ``key_path`` is
    ``report.key_path``; ``None`` falls back to ``$REPORTGEN_SIGNING_KEY``, then ``~/.config/reportgen/signing-key.pem``
    (see :func:`default_key_path`).

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


def generate_key(out: str | os.PathLike) -> tuple[Path, Path]:
    """Create an ECDSA P-256 key pair: private PEM at ``out`` (mode 0600), public beside it.

    The private file is created with ``O_CREAT | O_EXCL`` and mode 0600, so it is never
    readable by others, not even for a moment, and an existing key is never overwritten.

    Parent folders of ``out`` are created (mode 0700). Returns ``(private_path, public_path)``.

    Raises:
        FileExistsError: the private or the public key file exists already.
        OSError: the folder or file cannot be created.
    """
    private_path = Path(out).expanduser()
    public_path = public_key_path(private_path)
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} exists already; reportgen never overwrites a key")
    private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), 0o600)  # the umask may have removed bits, never added any
        handle.write(private_pem)
    try:
        fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(public_pem)
    except BaseException:
        private_path.unlink(missing_ok=True)
        raise
    return private_path, public_path


def main(argv: list[str] | None = None) -> int:
    """``python -m reportgen.keys generate [--out PATH]`` / ``fingerprint PUBLIC_KEY``.

    Returns:
        0 on success, 1 when the key exists already or cannot be written/read, 2 on usage errors.
    """
    parser = argparse.ArgumentParser(prog="python -m reportgen.keys", description="reportgen signing keys")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="create an ECDSA P-256 key pair (private key mode 0600)")
    gen.add_argument("--out", help=f"private key path (default: ${KEY_ENV}, else ~/.config/reportgen/signing-key.pem)")
    fp = sub.add_parser("fingerprint", help="print the SHA-256 fingerprint of a public key, as on page 1")
    fp.add_argument("public_key")
    args = parser.parse_args(argv)
    try:
        if args.command == "fingerprint":
            print(f"sha256:{fingerprint(load_public_key(args.public_key))}")
            return 0
        private_path, public_path = generate_key(Path(args.out) if args.out else default_key_path()[0])
    except (KeyFileError, OSError) as exc:
        said = "" if isinstance(exc, (FileExistsError, KeyFileError)) else "cannot write the key: "
        print(f"reportgen.trust.keys: {said}{exc}", file=sys.stderr)
        return 1
    print(f"private key: {private_path} (mode 0600; keep it secret, never commit it)")
    print(f"public key:  {public_path} (give this to reviewers)")
    print(f"fingerprint: sha256:{fingerprint(load_public_key(public_path))}")
    if args.out:
        print(
            f"use it with: python -m reportgen +model=... report.key_path={private_path}  "
            f"(or export {KEY_ENV}={private_path})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
