"""Sign a run: an in-toto statement in a DSSE envelope, and a PAdES signature on the PDF.

What ``sign_run`` leaves in the run folder (with signing on):

- ``statement.dsse.json``: a DSSE envelope (securesystemslib) around an in-toto Statement v1
  whose subjects are the SHA-256 digests of every file of the run (results.csv,
  results.json, report.html, report.unsigned.pdf, ``.hydra/*.yaml``, plots), and whose
  predicate holds the claim: checks, tolerances as decimal strings, costs, verdict and the
  list of required checks it follows from, environment.
- ``report.unsigned.pdf``: the PDF/A-3b that ``render_report`` wrote (results.json attached).
- ``report.pdf``: ``report.unsigned.pdf`` plus one incremental update that attaches the
  envelope and adds a PAdES signature (pyHanko) made with a self-signed X.509 certificate
  for the same key. Its first revision is byte for byte ``report.unsigned.pdf``, which the
  statement covers; the PAdES signature covers the whole file (the envelope cannot cover
  the PDF it is attached to).

``reportgen.verify`` checks all of it; the order here is the one it relies on.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from reportgen.errors import UsageError
from reportgen.files import atomic_write, record_written, sha256_file
from reportgen.results import Role, check_summary
from reportgen.trust.keys import GENERATE_COMMAND, KeyFileError, default_key_path, fingerprint, load_private_key
from reportgen.trust.manifest import PENDING_NAME, written_files

#: File names in a signed run folder.
ENVELOPE_NAME = "statement.dsse.json"
PDF_NAME = "report.pdf"
UNSIGNED_PDF_NAME = "report.unsigned.pdf"
RESULTS_NAME = "results.json"
#: in-toto Statement v1 and its DSSE payload type (in-toto attestation framework spec).
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
#: What the predicate is; documented in docs/reviewers.md ("Verify a report").
PREDICATE_TYPE = "https://reportgen.invalid/attestation/recompute-claim/v1"
#: Name of the PDF signature field.
SIGNATURE_FIELD = "reportgen"


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


# --------------------------------------------------------------------------- statement


def is_subject(relative: str) -> bool:
    """Whether a run-folder file (POSIX path relative to the folder) is a statement subject.

    Everything is, except the signed outputs themselves (report.pdf, the envelope), the mark of a
    run being signed (``report.pending.json``, removed once signed), Hydra's
    job log (``*.log`` at the top; it keeps growing after signing), and hidden temporary
    files of an interrupted atomic write (``.name.xxxx``).
    """
    name = relative.rsplit("/", 1)[-1]
    if relative in (PDF_NAME, ENVELOPE_NAME, PENDING_NAME) or name.startswith("."):
        return False
    return not ("/" not in relative and name.endswith(".log"))


def run_files(out_dir: Path) -> list[str]:
    """Regular files of a run folder that are statement subjects, as sorted POSIX paths: those the
    run wrote (its manifest, ``reportgen.trust.manifest``), or every file of a folder without one."""
    out_dir = Path(out_dir)
    files = (p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file() and not p.is_symlink())
    written = written_files(out_dir)
    return sorted(f for f in files if is_subject(f) and (written is None or f in written))


def decimal_string(value: Any) -> str | None:
    """A number as an exact decimal string (shortest round-trip digits, no exponent).

    ``1e-05`` → ``"0.00001"``; ints stay ints as text; NaN/None → ``None``; ±inf → ``"inf"``.
    JSON readers differ on floats; a decimal string reads the same everywhere.
    """
    if value is None or isinstance(value, bool):
        return None if value is None else str(value).lower()
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    try:
        value = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return np.format_float_positional(value, unique=True, trim="-")


def _plain(value: Any) -> Any:
    """numpy scalars → Python, NaN → None (the statement is strict JSON)."""
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    return value


#: Rows whose values the statement repeats as the claim's costs (memory and time).
COST_ROLES = (
    Role.SAVED_TOTAL,
    Role.SAVING,
    Role.STEP_PEAK,
    Role.PEAK_SAVING,
    Role.CUDA_PEAK,
    Role.MEDIAN,
    Role.OVERHEAD,
    Role.FLOPS,
)


def claim_predicate(frame: pd.DataFrame, meta: dict, verdict: str, required: Iterable[str]) -> dict:
    """The statement's predicate: what the report claims, with every number as a decimal string.

    Args:
        frame: the results frame (what results.json holds).
        meta: run metadata (``metadata.run_metadata``): claim, tolerances, environment.
        verdict: the claim verdict computed from ``frame`` and ``required``.
        required: the checks the verdict needs (``verdict.required``); ``reportgen.verify``
            recomputes the verdict from the attached results.json with this list.

    Returns:
        ``{"verdict", "required", "claim", "checks", "tolerances", "costs", "environment",
        "created", "command", "signer"}``, and ``"sweep"`` (``meta["sweep"]``: the job's number,
        overrides and launch digest, ``reportgen.trust.launch.job_launch``) for a sweep's job.
    """
    required = list(required)
    summary = check_summary(frame, required)
    seconds = frame.groupby("check", sort=False)["seconds"].sum() if len(frame) else pd.Series(dtype=float)
    checks = [
        {
            "check": s["check"],
            "status": s["status"],
            "required": bool(s["required"]),
            "rows": int(s["rows"]),
            "not_passing": int(s["failing"]),
            "seconds": decimal_string(seconds.get(s["check"], 0.0)),
        }
        for s in summary.to_dict("records")
    ]
    thresholds = sorted(
        {(c, m, t) for c, m, t in zip(frame.check, frame.metric, frame.threshold) if isinstance(t, str) and t}
    )
    tol = meta["tolerances"]
    costs = [
        {
            "check": r["check"],
            "item": r["item"],
            "variant": r["variant"],
            "metric": r["metric"],
            "value": decimal_string(r["value"]),
            "status": r["status"],
        }
        for r in frame[frame.role.isin(COST_ROLES)].to_dict("records")
    ]
    return {
        "verdict": verdict,
        "required": required,
        "claim": meta["claim"],
        "checks": checks,
        "tolerances": {
            "rtol": decimal_string(tol["rtol"]),
            "atol": decimal_string(tol["atol"]),
            "source": tol["source"],
            "thresholds": [{"check": c, "metric": m, "threshold": t} for c, m, t in thresholds],
        },
        "costs": costs,
        "environment": {k: _plain(v) for k, v in meta["environment"].items()},
        "created": meta["created"],
        "command": meta["command"],
        "signer": {"publicKeySha256": meta.get("signature", "").removeprefix("sha256:")},
        **({"sweep": meta["sweep"]} if meta.get("sweep") else {}),
    }


def build_statement(out_dir: Path, predicate: dict) -> dict:
    """An in-toto Statement v1 over every file of the run (see :func:`is_subject`).

    Returns:
        ``{"_type", "subject": [{"name", "digest": {"sha256"}}], "predicateType", "predicate"}``.

    Raises:
        OSError: a file of the run cannot be read.
    """
    subjects = [{"name": name, "digest": {"sha256": sha256_file(Path(out_dir) / name)}} for name in run_files(out_dir)]
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": PREDICATE_TYPE, "predicate": predicate}


def canonical_json(data: Any) -> bytes:
    """Sorted keys, no spaces, ASCII only: one byte string per value (the DSSE payload)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def envelope_file_bytes(envelope: dict) -> bytes:
    """The one byte layout of statement.dsse.json (indent 2, sorted keys, ASCII, final newline).

    ``reportgen.verify`` re-serialises what it parsed and requires the same bytes, so an
    edit that JSON or base64 would tolerate (whitespace, escapes, key order, base64 padding
    bits) still fails verification; the unsigned ``keyid`` must name the ``--key`` key.
    """
    return (json.dumps(envelope, indent=2, sort_keys=True, ensure_ascii=True) + "\n").encode()


def sslib_public_key(public_key: ec.EllipticCurvePublicKey):
    """securesystemslib key whose keyid is ``sha256:<fingerprint>`` (the page-1 fingerprint)."""
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(public_key, keyid=f"sha256:{fingerprint(public_key)}")


def sign_statement(statement: dict, key: SigningKey) -> bytes:
    """Sign a statement in a DSSE envelope (securesystemslib ``CryptoSigner``, ECDSA P-256/SHA-256).

    Returns:
        The envelope file, as :func:`envelope_file_bytes` lays it out.

    Raises:
        ValueError: the statement holds a value JSON cannot carry (NaN, infinity).
    """
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    envelope = Envelope(canonical_json(statement), PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(key.private_key, sslib_public_key(key.public_key)))
    return envelope_file_bytes(envelope.to_dict())


# --------------------------------------------------------------------------- PDF


def self_signed_certificate(key: SigningKey) -> x509.Certificate:
    """An X.509 certificate for the signing key, signed by itself, for the PAdES signature.

    Trust rests on the public key, not on the certificate: verify checks that the
    certificate's key is the reviewer's ``--key``. So the certificate is built from the key
    alone: subject names the fingerprint, serial = first 120 bits of it, valid from
    2000-01-01 to 9999-12-31T23:59:59Z (RFC 5280 §4.1.2.5 "no well-defined expiration"),
    so neither clock skew nor age makes a report fail. Key usage: digitalSignature and
    nonRepudiation (contentCommitment), as PAdES signers carry.
    """
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"reportgen signing key sha256:{key.fingerprint[:16]}"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "reportgen"),
        ]
    )
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=True,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key)
        .serial_number(int(key.fingerprint[:30], 16) | 1)
        .not_valid_before(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
        .not_valid_after(dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key), critical=False)
        .sign(key.private_key, hashes.SHA256())
    )


def _attach(writer, name: str, data: bytes, relationship: str, description: str, when: dt.datetime) -> None:
    """Attach a file in a pyHanko incremental update the way PDF/A-3 wants it.

    Like WeasyPrint's attachments: a MIME /Subtype, /Params (size, MD5, dates), a /Filespec
    with /F, /UF, /Desc and /AFRelationship, an entry in the EmbeddedFiles name tree (kept
    in sorted order) and in the catalog's /AF array. pyHanko's own ``embed_file`` would
    also mark the file PDF 2.0, which PDF/A-3 (PDF 1.7) must not be.
    """
    from pyhanko.pdf_utils import generic
    from pyhanko.pdf_utils.embed import EmbeddedFileObject, EmbeddedFileParams

    stream = EmbeddedFileObject.from_file_data(
        writer,
        data,
        compress=True,
        mime_type="application/json",
        params=EmbeddedFileParams(creation_date=when, modification_date=when),
    )
    spec = generic.DictionaryObject(
        {
            generic.pdf_name("/Type"): generic.pdf_name("/Filespec"),
            generic.pdf_name("/F"): generic.pdf_string(name),
            generic.pdf_name("/UF"): generic.pdf_string(name),
            generic.pdf_name("/EF"): generic.DictionaryObject(
                {generic.pdf_name("/F"): stream.ef_stream_ref, generic.pdf_name("/UF"): stream.ef_stream_ref}
            ),
            generic.pdf_name("/Desc"): generic.pdf_string(description),
            generic.pdf_name("/AFRelationship"): generic.pdf_name(f"/{relationship}"),
        }
    )
    spec_ref = writer.add_object(spec)
    root = writer.root
    if "/Names" not in root:
        root["/Names"] = generic.DictionaryObject()
    names = root["/Names"]
    if "/EmbeddedFiles" not in names:
        empty = generic.DictionaryObject({generic.pdf_name("/Names"): generic.ArrayObject()})
        names["/EmbeddedFiles"] = writer.add_object(empty)
    tree_ref = names.raw_get("/EmbeddedFiles")
    tree = tree_ref.get_object()
    entries = tree["/Names"]
    pairs = sorted([(str(entries[i]), entries.raw_get(i + 1)) for i in range(0, len(entries), 2)] + [(name, spec_ref)])
    tree["/Names"] = generic.ArrayObject([x for key, ref in pairs for x in (generic.pdf_string(key), ref)])
    if isinstance(tree_ref, generic.IndirectObject):
        writer.mark_update(tree_ref)
    af = root.get("/AF", generic.ArrayObject())
    root["/AF"] = generic.ArrayObject([*(af.raw_get(i) for i in range(len(af))), spec_ref])
    writer.update_root()


def _keep_metadata_consistent(writer) -> None:
    """Keep the Info dictionary equal to the XMP metadata that pyHanko rewrites (PDF/A 6.7.3).

    pyHanko writes ``pdf:Producer = "pyHanko x.y"`` into XMP but appends it to the existing
    Info /Producer ("WeasyPrint 70.0; pyHanko x.y"), which PDF/A validators flag as a
    mismatch. So Info /Producer becomes pyHanko's string (left alone by pyHanko, equal to
    XMP), and WeasyPrint moves to /Creator (``xmp:CreatorTool``), which pyHanko writes into both.
    """
    from pyhanko.pdf_utils import generic
    from pyhanko.pdf_utils.metadata.model import VENDOR
    from weasyprint import __version__ as weasyprint_version

    from reportgen import __version__

    writer.document_meta.creator = f"reportgen {__version__} (WeasyPrint {weasyprint_version})"
    info_ref = writer.trailer.raw_get("/Info") if "/Info" in writer.trailer else None
    if isinstance(info_ref, generic.IndirectObject):
        info_ref.get_object()["/Producer"] = generic.pdf_string(VENDOR)
        writer.mark_update(info_ref)


def sign_pdf(unsigned: bytes, envelope: bytes, key: SigningKey, reason: str) -> bytes:
    """Attach the envelope to the PDF/A and sign it with PAdES (pyHanko), in one incremental update.

    The result starts with ``unsigned`` byte for byte; the signature's /ByteRange covers
    the whole file except its own /Contents.

    Args:
        unsigned: the PDF/A-3b from ``render.write_pdf``.
        envelope: statement.dsse.json bytes, attached as ``statement.dsse.json``.
        key: the signing key.
        reason: the signature's /Reason (shown by PDF viewers).

    Returns:
        The signed PDF, bytes.

    Raises:
        pyhanko.pdf_utils.misc.PdfError: ``unsigned`` is not a PDF pyHanko can update.
    """
    from asn1crypto import keys as asn1_keys
    from asn1crypto import x509 as asn1_x509
    from pyhanko.pdf_utils.incremental_writer import IncrementalPdfFileWriter
    from pyhanko.sign import fields, signers
    from pyhanko_certvalidator.registry import SimpleCertificateStore

    certificate = asn1_x509.Certificate.load(self_signed_certificate(key).public_bytes(serialization.Encoding.DER))
    private = asn1_keys.PrivateKeyInfo.load(
        key.private_key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    # The CMS carries exactly one certificate (the signer's; no separate "root" copy), the
    # layout that reportgen.verify insists on.
    signer = signers.SimpleSigner(
        signing_cert=certificate, signing_key=private, cert_registry=SimpleCertificateStore(), embed_roots=False
    )
    writer = IncrementalPdfFileWriter(io.BytesIO(unsigned))
    _keep_metadata_consistent(writer)
    _attach(
        writer,
        ENVELOPE_NAME,
        envelope,
        "Supplement",
        "DSSE envelope (in-toto Statement v1) over the run's files; check with python -m reportgen.verify",
        dt.datetime.now(dt.UTC).replace(microsecond=0),
    )
    meta = signers.PdfSignatureMetadata(
        field_name=SIGNATURE_FIELD,
        md_algorithm="sha256",
        subfilter=fields.SigSeedSubFilter.PADES,
        reason=reason,
        name=f"reportgen key sha256:{key.fingerprint}",
    )
    return signers.sign_pdf(writer, meta, signer=signer).getvalue()


# --------------------------------------------------------------------------- the stage


def sign_run(
    frame: pd.DataFrame, meta: dict, verdict: str, out_dir: Path, key: SigningKey | None, required: Iterable[str]
) -> dict[str, Path]:
    """Sign everything the run wrote: statement.dsse.json, then the signed report.pdf.

    Does nothing when ``key`` is ``None`` (signing off: report.pdf stays the unsigned PDF/A).
    The unsigned PDF is renamed ``report.unsigned.pdf`` and becomes a statement subject.

    Args:
        frame, meta, verdict, required: as for :func:`claim_predicate`.
        out_dir: the run folder; results and report are written already.
        key: from :func:`load_signing_key`.

    Returns:
        ``{"statement": path, "pdf": path}`` of what was written (``pdf`` only with a PDF).

    Raises:
        FileExistsError: a signed output exists already (outputs never overwrite a run).
    """
    if key is None:
        return {}
    out_dir = Path(out_dir)
    pdf, unsigned = set_aside_unsigned(out_dir / PDF_NAME, out_dir / UNSIGNED_PDF_NAME)
    statement = build_statement(out_dir, claim_predicate(frame, meta, verdict, required))
    envelope = sign_statement(statement, key)
    paths = {"statement": atomic_write(out_dir / ENVELOPE_NAME, envelope)}
    if unsigned.exists():
        reason = f"reportgen activation-recomputation report; claim verdict {verdict}"
        paths["pdf"] = atomic_write(pdf, sign_pdf(unsigned.read_bytes(), envelope, key, reason))
    return paths


def set_aside_unsigned(pdf: Path, unsigned: Path) -> tuple[Path, Path]:
    """Rename the rendered ``pdf`` to ``unsigned`` (a statement subject) before signing.

    Returns:
        ``(pdf, unsigned)``, for the signed PDF to be written at ``pdf``.

    Raises:
        FileExistsError: ``unsigned`` exists already (outputs never overwrite a run).
    """
    if pdf.exists():
        if unsigned.exists():
            raise FileExistsError(f"{unsigned} exists already; reportgen never overwrites an earlier run")
        os.replace(pdf, unsigned)
        record_written(unsigned)
    return pdf, unsigned


def decode_b64(text: str) -> bytes:
    """Strict base64: alphabet only, and ``text`` must be the canonical encoding of the result.

    Raises:
        ValueError: anything else (Python's decoder alone ignores padding bits).
    """
    raw = base64.b64decode(text, validate=True)
    if base64.b64encode(raw).decode() != text:
        raise ValueError("base64 is not in canonical form")
    return raw


# --------------------------------------------------------------------------- documents over runs


def sign_document(
    out_dir: Path,
    stem: str,
    subjects: Iterable[str],
    predicate: dict,
    predicate_type: str,
    key: SigningKey | None,
    reason: str,
) -> dict[str, Path]:
    """Sign a document made from several runs (a sweep summary, a comparison) like a run.

    The same layout as :func:`sign_run`, with ``stem`` for ``report``: ``<stem>.pdf`` (as
    rendered) becomes ``<stem>.unsigned.pdf``; ``<stem>.dsse.json`` is a DSSE envelope around
    an in-toto Statement v1 over ``subjects`` (typically the document's own files plus every
    job's ``statement.dsse.json``); ``<stem>.pdf`` is the unsigned PDF plus the attached
    envelope and a PAdES signature. Does nothing when ``key`` is ``None``.

    Args:
        out_dir: folder the document and its subjects live in.
        stem: file-name stem, e.g. ``"summary"``.
        subjects: POSIX paths relative to ``out_dir``; missing ones are skipped.
        predicate: the statement's predicate (strict JSON: no NaN).
        predicate_type: URI naming what the predicate means.
        key: from :func:`load_signing_key`.
        reason: the PDF signature's /Reason.

    Returns:
        ``{"statement": path, "pdf": path}`` of what was written (``pdf`` only with a PDF).

    Raises:
        FileExistsError: a signed output exists already (outputs never overwrite a run).
    """
    if key is None:
        return {}
    out_dir = Path(out_dir)
    pdf, unsigned = set_aside_unsigned(out_dir / f"{stem}.pdf", out_dir / f"{stem}.unsigned.pdf")
    names = sorted({*subjects, *([unsigned.name] if unsigned.exists() else [])})
    statement = {
        "_type": STATEMENT_TYPE,
        "predicateType": predicate_type,
        "predicate": predicate,
        "subject": [
            {"name": n, "digest": {"sha256": sha256_file(out_dir / n)}} for n in names if (out_dir / n).is_file()
        ],
    }
    envelope = sign_statement(statement, key)
    paths = {"statement": atomic_write(out_dir / f"{stem}.dsse.json", envelope)}
    if unsigned.exists():
        paths["pdf"] = atomic_write(pdf, sign_pdf(unsigned.read_bytes(), envelope, key, reason))
    return paths
