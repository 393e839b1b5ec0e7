"""What every signed reportgen document shares: PDF signature, DSSE envelope, statement, subjects.

The run, sweep and comparison verifiers (``reportgen.verify.run``, ``.sweep``,
``.comparison``) build on these checks; each returns :class:`Check` lines, PASS, FAIL or
NOTE (NOTE informs and never fails). Nothing touches the network.
"""
from __future__ import annotations

import binascii
import copy
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from cryptography.hazmat.primitives.asymmetric import ec

from ..attachments import AttachmentError, embedded_files  # noqa: F401 - re-exported
from ..keys import fingerprint
from ..signing import ENVELOPE_NAME, PAYLOAD_TYPE, STATEMENT_TYPE, decode_b64, envelope_file_bytes, sslib_public_key

PASS, FAIL, NOTE = "PASS", "FAIL", "NOTE"


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
        separator = f": {detail}" if self.status == FAIL else f" ({detail})"
        return f"{self.status} {self.name}{separator}"


def short_digest(hex_digest: str) -> str:
    """``sha256:0123456789abcdef...``: enough digits to compare by eye."""
    return f"sha256:{hex_digest[:16]}..."


def attempt(name: str, fn: Callable[[], str]) -> Check:
    """Run one check; its return value is the PASS detail, any exception a FAIL (one line, no traceback)."""
    try:
        return Check(PASS, name, fn())
    except Exception as exc:  # noqa: BLE001 - tampered input raises anything; every one is a FAIL
        message = str(exc) or type(exc).__name__
        return Check(FAIL, name, message if isinstance(exc, (VerifyError, AttachmentError)) else f"{type(exc).__name__}: {message}")


class VerifyError(Exception):
    """A check found something wrong (its message is the FAIL detail)."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`VerifyError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise VerifyError(message)


def sha256_hex(data: bytes) -> str:
    """SHA-256 of bytes, hex."""
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- the PDF


@dataclass
class PdfEvidence:
    """What a signed report.pdf carries: its bytes, attachments by name, and check results."""

    data: bytes
    attachments: dict[str, bytes]
    checks: list[Check]


def _check_signature_bytes(data: bytes, signature) -> str:
    """/ByteRange covers byte 0 to the end of the file, and /Contents is exactly what pyHanko writes.

    A PDF viewer checks the bytes in /ByteRange; the gap holding /Contents is not hashed.
    pyHanko writes it as ``<`` + upper-case hex of the DER CMS + ``0`` padding + ``>``.
    Hex is case-insensitive and DER readers ignore trailing bytes, so without this check a
    changed letter case or a changed padding digit would go unnoticed.
    """
    byte_range = [int(x) for x in signature.byte_range]
    require(len(byte_range) == 4 and byte_range[0] == 0, f"unusual /ByteRange {byte_range}")
    _, len1, start2, len2 = byte_range
    require(start2 + len2 == len(data), f"/ByteRange ends at byte {start2 + len2}, the file at {len(data)}: "
                                         "bytes after the signed range")
    contents = signature.pkcs7_content
    require(data[len1:start2] == b"<" + binascii.hexlify(contents).upper() + b">",
             "/Contents is not the signed range's exact complement")
    from asn1crypto import cms

    der_length = len(cms.ContentInfo.load(contents).dump())
    require(not contents[der_length:].strip(b"\0"), "non-zero bytes after the CMS signature in /Contents")
    return "covers the whole file but its own /Contents"


def _der_length(data: bytes, start: int = 0) -> int:
    """Length of the DER TLV at ``start``, checking its whole tree on the way.

    Every length is definite and minimal, no tag is 0 (end-of-contents, BER only) or in
    high-tag-number form (CMS does not use it), and every constructed value is exactly
    the sequence of its children: no trailing bytes. (asn1crypto tolerates a longer outer
    length with zero bytes after the last field; DER does not.)

    Raises:
        VerifyError: the bytes are not DER.
    """
    require(start + 2 <= len(data), "truncated DER")
    tag, first = data[start], data[start + 1]
    require(tag != 0 and tag & 0x1F != 0x1F, f"unexpected DER tag {tag:#04x}")
    if first < 0x80:
        length, header = first, 2
    else:
        count = first & 0x7F
        require(0 < count <= 4 and start + 2 + count <= len(data), "bad DER length")
        length = int.from_bytes(data[start + 2:start + 2 + count], "big")
        require(length >= 0x80 and length >= 1 << (8 * (count - 1)), "non-minimal DER length")
        header = 2 + count
    end = start + header + length
    require(end <= len(data), "DER value runs past the end")
    if tag & 0x20:  # constructed: children fill it exactly
        child = start + header
        while child < end:
            child += _der_length(data[:end], child)
        require(child == end, "DER children overrun their parent")
    return end - start


def _check_cms(contents: bytes) -> str:
    """The CMS in /Contents has exactly the layout ``signing.sign_pdf`` makes, and its certificate is genuine.

    A CMS signature does not sign every byte of its own container: the SignedData and
    SignerInfo versions, the digestAlgorithms set and the certificates travel unsigned. A
    changed version or a second, different certificate would pass a validator; here each
    such field must be what pyHanko writes for reportgen, the DER must re-encode to the
    same bytes, and the one certificate must carry a valid self-signature (with the key
    checked against ``--key`` separately) and the hash its signed ESS
    signing-certificate-v2 attribute names.

    Raises:
        VerifyError: any difference.
    """
    from asn1crypto import cms
    from cryptography import x509

    require(_der_length(contents) == len(cms.ContentInfo.load(contents).dump()), "the CMS is not one DER value")
    info = cms.ContentInfo.load(contents)
    require(info["content_type"].native == "signed_data", "the CMS is not SignedData")
    signed = info["content"]
    sha256 = [{"algorithm": "sha256", "parameters": None}]
    require(signed["version"].native == "v1" and signed["digest_algorithms"].native == sha256
             and signed["encap_content_info"].native == {"content_type": "data", "content": None}
             and signed["crls"].native is None and len(signed["signer_infos"]) == 1,
             "the CMS SignedData fields are not reportgen's")
    certificates = signed["certificates"]
    require(certificates.native is not None and len(certificates) == 1, "the CMS must carry exactly one certificate")
    cert = certificates[0].chosen
    signer = signed["signer_infos"][0]
    attrs = {a["type"].native: a["values"] for a in signer["signed_attrs"]}
    require(signer["version"].native == "v1" and signer["sid"].name == "issuer_and_serial_number"
             and signer["sid"].chosen["issuer"] == cert.issuer
             and signer["sid"].chosen["serial_number"].native == cert.serial_number
             and signer["digest_algorithm"].native == sha256[0]
             and signer["signature_algorithm"]["algorithm"].native == "sha256_ecdsa"
             and signer["unsigned_attrs"].native is None
             and set(attrs) == {"content_type", "message_digest", "signing_certificate_v2"},
             "the CMS SignerInfo fields are not reportgen's")
    ess = attrs["signing_certificate_v2"][0]["certs"][0]
    require(ess["hash_algorithm"]["algorithm"].native == "sha256"
             and ess["cert_hash"].native == hashlib.sha256(cert.dump()).digest(),
             "the signed signing-certificate attribute names another certificate")
    crypto_cert = x509.load_der_x509_certificate(cert.dump())
    try:
        crypto_cert.verify_directly_issued_by(crypto_cert)
    except Exception:  # noqa: BLE001 - InvalidSignature, ValueError, TypeError
        raise VerifyError("the certificate's self-signature does not verify") from None
    return "CMS layout as signed"


def check_pdf(data: bytes, public_key: ec.EllipticCurvePublicKey,
              required: tuple[str, ...] = ("results.json", ENVELOPE_NAME)) -> PdfEvidence:
    """Checks 1-3 of a signed PDF (``reportgen.verify``): one whole-file PAdES signature by
    ``--key``, and the attachments the rest of the checks need.

    Args:
        data: the PDF file.
        public_key: the reviewer's ``--key``.
        required: attachments that must be present (a run's report.pdf: results.json and the
            envelope; a sweep's summary.pdf: summary.json and the envelope).

    Returns:
        The evidence; ``attachments`` is empty when the PDF could not be read.
    """
    from pyhanko.pdf_utils.reader import PdfFileReader
    from pyhanko.sign.validation import validate_pdf_signature
    from pyhanko.sign.validation.status import SignatureCoverageLevel
    from pyhanko_certvalidator import ValidationContext

    checks: list[Check] = []
    state: dict = {}

    def read() -> str:
        reader = PdfFileReader(io.BytesIO(data), strict=True)
        signatures = reader.embedded_signatures
        require(len(signatures) == 1, f"{len(signatures)} signatures in the PDF, expected 1")
        state["reader"], state["signature"] = reader, signatures[0]
        return f"{len(data)} bytes, one signature field {signatures[0].field_name!r}"

    checks.append(attempt("PDF signature found", read))
    if "signature" not in state:
        return PdfEvidence(data, {}, checks)
    signature = state["signature"]

    def pades() -> str:
        cert = signature.signer_cert
        context = ValidationContext(trust_roots=[cert], allow_fetching=False)
        status = validate_pdf_signature(signature, context)
        require(status.intact, "the signed bytes were changed (digest mismatch)")
        require(status.valid, "the CMS signature does not verify")
        require(status.coverage == SignatureCoverageLevel.ENTIRE_FILE,
                 f"the signature covers {status.coverage.name}, not the entire file")
        require(status.trusted and status.bottom_line, f"pyHanko's validator: {status.summary()}")
        return (f"PAdES, pyHanko validator: intact, valid; {_check_signature_bytes(data, signature)}; "
                f"{_check_cms(signature.pkcs7_content)}")

    def signer() -> str:
        from cryptography import x509

        cert = x509.load_der_x509_certificate(signature.signer_cert.dump())
        signed_by = fingerprint(cert.public_key())  # SHA-256 of the DER SubjectPublicKeyInfo
        require(signed_by == fingerprint(public_key), f"signed with key {short_digest(signed_by)}, not the given key")
        return f"certificate key is the given key {short_digest(fingerprint(public_key))}"

    checks.append(attempt("PDF signature", pades))
    checks.append(attempt("PDF signer", signer))

    def attachments() -> str:
        state["files"] = files = embedded_files(state["reader"])
        missing = set(required) - set(files)
        require(not missing, f"missing attachment(s): {', '.join(sorted(missing))}")
        return ", ".join(sorted(files))

    checks.append(attempt("PDF attachments", attachments))
    return PdfEvidence(data, state.get("files", {}), checks)


def first_revision_digests(data: bytes) -> set[str]:
    """SHA-256 of every prefix of ``data`` that ends at an ``%%EOF`` marker (+ its EOL).

    The first revision of report.pdf is report.unsigned.pdf byte for byte; the statement
    gives its digest, so one of these prefixes must have it.
    """
    digests, start = set(), 0
    while (at := data.find(b"%%EOF", start)) >= 0:
        for end in (at + 5, at + 6, at + 7):
            digests.add(sha256_hex(data[:end]))
        start = at + 5
    return digests


# --------------------------------------------------------------------------- the statement


def check_envelope(raw: bytes, public_key: ec.EllipticCurvePublicKey, predicate_type: str,
                   check_predicate: Callable[[dict], str]) -> tuple[list[Check], dict | None]:
    """Checks 4-5: the envelope's layout and signature, and the statement's shape.

    Args:
        raw: the envelope file's bytes.
        public_key: the reviewer's ``--key``.
        predicate_type: the statement's expected ``predicateType`` (run, sweep or comparison).
        check_predicate: ``fn(predicate) -> detail``; raises :class:`VerifyError` when the
            predicate lacks what its kind of document must state.

    Returns:
        The checks and the statement (``None`` unless the signature verified).
    """
    from securesystemslib.dsse import Envelope

    state: dict = {}
    fp = fingerprint(public_key)

    def signature() -> str:
        try:
            envelope = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VerifyError(f"not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
        require(isinstance(envelope, dict) and set(envelope) == {"payload", "payloadType", "signatures"},
                 "not a DSSE envelope (payload, payloadType, signatures)")
        require(envelope_file_bytes(envelope) == raw, "not in its canonical layout: the file was edited")
        require(envelope["payloadType"] == PAYLOAD_TYPE, f"payloadType {envelope['payloadType']!r}")
        signatures = envelope["signatures"]
        require(isinstance(signatures, list) and len(signatures) == 1
                 and set(signatures[0]) == {"keyid", "sig"}, "expected exactly one signature {keyid, sig}")
        payload = decode_b64(envelope["payload"])
        decode_b64(signatures[0]["sig"])
        try:
            Envelope.from_dict(copy.deepcopy(envelope)).verify([sslib_public_key(public_key)], 1)
        except Exception:  # noqa: BLE001 - securesystemslib's VerificationError and friends
            raise VerifyError(f"no valid signature by key {short_digest(fp)} "
                              f"(envelope names key {str(signatures[0]['keyid'])[:23]}...)") from None
        state["payload"] = payload
        return f"DSSE, key sha256:{fp}"

    def statement() -> str:
        require("payload" in state, "not checked: the envelope signature did not verify")
        data = json.loads(state["payload"])
        require(data.get("_type") == STATEMENT_TYPE, f"_type {data.get('_type')!r}, expected {STATEMENT_TYPE}")
        require(data.get("predicateType") == predicate_type,
                f"predicateType {data.get('predicateType')!r}, expected {predicate_type}")
        subjects = data.get("subject")
        require(isinstance(subjects, list) and subjects, "no subjects")
        for s in subjects:
            require(isinstance(s.get("name"), str) and isinstance(s.get("digest", {}).get("sha256"), str),
                     f"malformed subject {s!r}")
        require(len({s["name"] for s in subjects}) == len(subjects), "a subject is listed twice")
        predicate = data.get("predicate", {})
        require(isinstance(predicate, dict), "the predicate is not an object")
        signer = predicate.get("signer", {}).get("publicKeySha256")
        require(signer in (None, "", fp), f"the predicate names signer {signer}")
        detail = check_predicate(predicate)
        state["statement"] = data
        return f"in-toto Statement v1, {len(subjects)} subjects, {detail}"

    checks = [attempt("envelope signature", signature), attempt("statement", statement)]
    return checks, state.get("statement")


def subject_digests(statement: dict) -> dict[str, str]:
    """``{subject name: sha256 hex}``."""
    return {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}


def safe_relative(name: str) -> bool:
    """A subject name that stays inside the run folder (no absolute path, no ``..``)."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def check_subjects(folder: Path, digests: dict[str, str]) -> list[Check]:
    """One check per statement subject: it stays inside ``folder``, exists, and has its digest.

    Args:
        folder: the run, sweep or comparison folder the subject names are relative to.
        digests: ``{subject name: sha256 hex}`` (:func:`subject_digests`).
    """
    checks = []
    for name, digest in sorted(digests.items()):
        def subject(name=name, digest=digest) -> str:
            require(safe_relative(name), f"subject name {name!r} points outside the folder")
            path = Path(folder) / name
            require(path.is_file(), "missing")
            require(sha256_hex(path.read_bytes()) == digest, "sha256 differs from the statement: the file was changed")
            return short_digest(digest)

        checks.append(attempt(f"subject {name}", subject))
    return checks


def peek_predicate_type(envelope: bytes) -> str | None:
    """The ``predicateType`` an envelope claims, read WITHOUT verifying it (to choose the verifier).

    Returns:
        The type, or ``None`` when the bytes are not a readable envelope (the chosen verifier
        then fails with the precise reason).
    """
    try:
        return json.loads(decode_b64(json.loads(envelope)["payload"])).get("predicateType")
    except Exception:  # noqa: BLE001 - anything unreadable: the full check says why
        return None


def unlisted_files(run_dir: Path, listed, own: tuple[str, ...] = ("report.pdf", ENVELOPE_NAME)) -> list[tuple[str, str]]:
    """Everything in a run folder that the statement does not list, logs and dotfiles included.

    The signed outputs themselves (report.pdf, statement.dsse.json) are checked on their own
    and left out. Symbolic links are named and never followed.

    Args:
        run_dir: the run folder.
        listed: the statement's subject names.
        own: the signed outputs themselves, checked on their own (PDF and envelope).

    Returns:
        ``(relative POSIX path, kind prefix)`` pairs, sorted; the prefix is ``""`` for a
        regular file, else e.g. ``"a symbolic link, "``.
    """
    out = []
    for dirpath, dirnames, filenames in os.walk(run_dir, followlinks=False):
        base = Path(dirpath)
        for name in [*filenames, *(d for d in dirnames if (base / d).is_symlink())]:
            path = base / name
            relative = path.relative_to(run_dir).as_posix()
            if relative in listed or relative in own:
                continue
            kind = "a symbolic link, " if path.is_symlink() else ("" if path.is_file() else "not a regular file, ")
            out.append((relative, kind))
    return sorted(out)




# --------------------------------------------------------------------------- documents


@dataclass(frozen=True)
class Document:
    """What one kind of signed reportgen document is made of (a run, a sweep summary, a comparison).

    Attributes:
        label: what verify says it checked, e.g. ``"run"``.
        envelope: the envelope's file name in the folder, e.g. ``statement.dsse.json``.
        pdf: the signed PDF's file name, e.g. ``report.pdf``.
        unsigned: the rendered PDF before signing (a statement subject).
        data: the data file attached in the PDF and listed as a subject (results.json, ...).
        predicate_type: the statement's ``predicateType``.
        check_predicate: ``fn(predicate) -> detail``; raises :class:`VerifyError` when the
            predicate lacks what this kind must state.
    """

    label: str
    envelope: str
    pdf: str
    unsigned: str
    data: str
    predicate_type: str
    check_predicate: Callable[[dict], str]


@dataclass
class Verified:
    """What verifying one document found: the check lines, the verified statement (or None),
    and the bytes of its data file that the statement vouches for (or None)."""

    checks: list[Check]
    statement: dict | None = None
    data: bytes | None = None


def verify_signed_pdf(pdf: bytes, public_key: ec.EllipticCurvePublicKey, doc: Document) -> tuple[Verified, dict]:
    """A lone signed PDF of kind ``doc``: signature, signer, attached envelope and statement, the
    attached data file's digest, and the first revision as the signed unsigned PDF.

    Returns:
        ``(Verified, attachments)``; ``Verified.data`` is set only when the attached data file
        is the signed one.
    """
    evidence = check_pdf(pdf, public_key, required=(doc.data, ENVELOPE_NAME))
    found = Verified(list(evidence.checks))
    envelope = evidence.attachments.get(ENVELOPE_NAME)
    if envelope is None:
        found.checks.append(Check(FAIL, "envelope signature", f"no {ENVELOPE_NAME} attached in the PDF"))
        return found, evidence.attachments
    envelope_checks, found.statement = check_envelope(envelope, public_key, doc.predicate_type, doc.check_predicate)
    found.checks += envelope_checks
    if found.statement is None:
        return found, evidence.attachments
    digests = subject_digests(found.statement)
    data = evidence.attachments.get(doc.data, b"")

    def attached_data() -> str:
        require(doc.data in digests, f"the statement has no {doc.data} subject")
        require(sha256_hex(data) == digests[doc.data], f"the attached {doc.data} is not the signed one")
        return f"attached in the PDF, {short_digest(digests[doc.data])}"

    def pages() -> str:
        require(doc.unsigned in digests, f"the statement has no {doc.unsigned} subject")
        require(digests[doc.unsigned] in first_revision_digests(pdf),
                f"the PDF's first revision is not the signed {doc.unsigned}")
        return f"the PDF's first revision is the signed {doc.unsigned}, {short_digest(digests[doc.unsigned])}"

    found.checks += [attempt(f"attached {doc.data}", attached_data), attempt("rendered pages", pages)]
    if found.checks[-2].status == PASS:
        found.data = data
    return found, evidence.attachments


def verify_document_dir(folder: Path, public_key: ec.EllipticCurvePublicKey, doc: Document,
                        note_unlisted: bool = True) -> Verified:
    """A folder holding a signed document of kind ``doc``: its PDF (when there is one), the
    envelope on disk (the one attached in the PDF), and every subject's digest.

    Args:
        folder: the run, sweep or comparison folder.
        public_key: the reviewer's ``--key``.
        doc: the kind of document.
        note_unlisted: add a NOTE per file the statement does not list.

    Returns:
        The checks; ``data`` holds the data file's bytes when the statement vouches for them.
    """
    folder = Path(folder)
    envelope_path, pdf_path = folder / doc.envelope, folder / doc.pdf
    if not envelope_path.is_file():
        return Verified([Check(FAIL, "envelope signature", f"no {doc.envelope} in {folder}: the {doc.label} "
                                                           "was not signed (report.sign=false?)")])
    envelope = envelope_path.read_bytes()
    found = Verified([])
    if pdf_path.is_file():
        found, attachments = verify_signed_pdf(pdf_path.read_bytes(), public_key, doc)
        same = attachments.get(ENVELOPE_NAME) == envelope
        found.checks.append(Check(PASS, f"{doc.envelope} on disk", f"is the envelope attached in {doc.pdf}") if same
                            else Check(FAIL, f"{doc.envelope} on disk", f"differs from the envelope attached in {doc.pdf}"))
        if not same:
            found.statement, found.data = None, None
    if found.statement is None:
        envelope_checks, found.statement = check_envelope(envelope, public_key, doc.predicate_type, doc.check_predicate)
        found.checks += [Check(c.status, f"{c.name} ({doc.envelope} on disk)", c.detail) for c in envelope_checks]
    if found.statement is None:
        return found
    digests = subject_digests(found.statement)
    if not pdf_path.is_file():
        found.checks.append(Check(FAIL, doc.pdf, "missing, but the statement covers a rendered PDF")
                            if doc.unsigned in digests else
                            Check(NOTE, doc.pdf, f"none in this {doc.label}, made with report.pdf=false"))
    subject_checks = check_subjects(folder, digests)
    found.checks += subject_checks
    if found.data is None and doc.data in digests and all(c.status == PASS for c in subject_checks
                                                          if c.name == f"subject {doc.data}"):
        found.data = (folder / doc.data).read_bytes()
    if note_unlisted:
        for name, kind in unlisted_files(folder, digests, own=(doc.pdf, doc.envelope)):
            found.checks.append(Check(NOTE, f"not covered: {name}", f"{kind}not in the statement; nothing vouches for it"))
    return found
