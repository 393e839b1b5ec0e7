"""``python -m reportgen.verify <run dir | report.pdf> --key <public key>``: check a signed report offline.

One line per check, ``PASS ...`` or ``FAIL ...`` (``NOTE`` lines inform and never fail);
exit 0 when every check holds, 1 when any fails, 2 when the command cannot start (no such
path, unreadable or unsupported key). Nothing touches the network.

Checks, for a lone report.pdf (everything comes from inside the PDF):

1. the PDF signature: exactly one; pyHanko's validator (``validate_pdf_signature``, the
   embedded certificate as the only trust root) finds it intact, valid and trusted; it
   covers the entire file (/ByteRange from byte 0 to the last byte) and its /Contents is
   exactly the hex that pyHanko writes (upper case, zero padding), so no byte of the file
   can change unnoticed;
2. the certificate that made it holds the ``--key`` public key;
3. the attachments results.json and statement.dsse.json are present, once each;
4. the DSSE envelope is in its one canonical layout and its signature verifies with
   ``--key`` (securesystemslib);
5. the statement is an in-toto Statement v1 with reportgen's predicate;
6. the attached results.json has the digest the statement gives it;
7. the PDF's first revision (the rendered pages before signing) has the digest of the
   statement's ``report.unsigned.pdf`` subject;
8. every row's status recomputed from its signed value, threshold and comparator
   (``results.judge_record``) equals the status it states; PASS and FAIL only come from a
   comparison, FLAGGED only in a flagged experiment; then the verdict recomputed from those
   statuses (``results.claim_verdict`` with the statement's required checks) equals the
   statement's verdict.

For a run folder, additionally: statement.dsse.json on disk is the envelope attached in
report.pdf, and every subject of the statement exists with its digest. Files of the
folder that the statement does not list are named in ``NOTE`` lines: nothing vouches for them.
"""
from __future__ import annotations

import argparse
import binascii
import copy
import hashlib
import io
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable

from cryptography.hazmat.primitives.asymmetric import ec

from .keys import KeyFileError, fingerprint, load_public_key
from .checks import flagged_names
from .results import FAIL as ROW_FAIL
from .results import FLAGGED, PASS as ROW_PASS
from .results import claim_verdict, frame_from_json, judge_record
from .signing import (ENVELOPE_NAME, PAYLOAD_TYPE, PDF_NAME, PREDICATE_TYPE, RESULTS_NAME, STATEMENT_TYPE,
                      UNSIGNED_PDF_NAME, decode_b64, envelope_file_bytes, run_files, sslib_public_key)

EXIT_VERIFIED, EXIT_NOT_VERIFIED, EXIT_USAGE = 0, 1, 2
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


def _short(hex_digest: str) -> str:
    """``sha256:0123456789abcdef...``: enough digits to compare by eye."""
    return f"sha256:{hex_digest[:16]}..."


def _attempt(name: str, fn: Callable[[], str]) -> Check:
    """Run one check; its return value is the PASS detail, any exception a FAIL (one line, no traceback)."""
    try:
        return Check(PASS, name, fn())
    except Exception as exc:  # noqa: BLE001 - tampered input raises anything; every one is a FAIL
        message = str(exc) or type(exc).__name__
        return Check(FAIL, name, message if isinstance(exc, VerifyError) else f"{type(exc).__name__}: {message}")


class VerifyError(Exception):
    """A check found something wrong (its message is the FAIL detail)."""


def _require(condition: bool, message: str) -> None:
    """Raise :class:`VerifyError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise VerifyError(message)


def _sha256(data: bytes) -> str:
    """SHA-256 of bytes, hex."""
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- the PDF


@dataclass
class PdfEvidence:
    """What a signed report.pdf carries: its bytes, attachments by name, and check results."""

    data: bytes
    attachments: dict[str, bytes]
    checks: list[Check]


def _embedded_files(reader) -> dict[str, bytes]:
    """Attachments of the PDF's EmbeddedFiles name tree (flat, as WeasyPrint and sign_pdf write it).

    Raises:
        VerifyError: no attachments, a nested name tree, or a name present twice.
    """
    root = reader.root
    _require("/Names" in root and "/EmbeddedFiles" in root["/Names"], "the PDF has no attached files")
    tree = root["/Names"]["/EmbeddedFiles"]
    _require("/Kids" not in tree, "nested EmbeddedFiles name tree (reportgen writes a flat one)")
    names = tree["/Names"]
    files: dict[str, bytes] = {}
    for i in range(0, len(names), 2):
        spec = names[i + 1]
        name = str(spec.get("/UF", spec.get("/F", names[i])))
        _require(name not in files, f"attachment {name} appears twice")
        files[name] = spec["/EF"]["/F"].data
    return files


def _check_signature_bytes(data: bytes, signature) -> str:
    """/ByteRange covers byte 0 to the end of the file, and /Contents is exactly what pyHanko writes.

    A PDF viewer checks the bytes in /ByteRange; the gap holding /Contents is not hashed.
    pyHanko writes it as ``<`` + upper-case hex of the DER CMS + ``0`` padding + ``>``.
    Hex is case-insensitive and DER readers ignore trailing bytes, so without this check a
    changed letter case or a changed padding digit would go unnoticed.
    """
    byte_range = [int(x) for x in signature.byte_range]
    _require(len(byte_range) == 4 and byte_range[0] == 0, f"unusual /ByteRange {byte_range}")
    _, len1, start2, len2 = byte_range
    _require(start2 + len2 == len(data), f"/ByteRange ends at byte {start2 + len2}, the file at {len(data)}: "
                                         "bytes after the signed range")
    contents = signature.pkcs7_content
    _require(data[len1:start2] == b"<" + binascii.hexlify(contents).upper() + b">",
             "/Contents is not the signed range's exact complement")
    from asn1crypto import cms

    der_length = len(cms.ContentInfo.load(contents).dump())
    _require(not contents[der_length:].strip(b"\0"), "non-zero bytes after the CMS signature in /Contents")
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
    _require(start + 2 <= len(data), "truncated DER")
    tag, first = data[start], data[start + 1]
    _require(tag != 0 and tag & 0x1F != 0x1F, f"unexpected DER tag {tag:#04x}")
    if first < 0x80:
        length, header = first, 2
    else:
        count = first & 0x7F
        _require(0 < count <= 4 and start + 2 + count <= len(data), "bad DER length")
        length = int.from_bytes(data[start + 2:start + 2 + count], "big")
        _require(length >= 0x80 and length >= 1 << (8 * (count - 1)), "non-minimal DER length")
        header = 2 + count
    end = start + header + length
    _require(end <= len(data), "DER value runs past the end")
    if tag & 0x20:  # constructed: children fill it exactly
        child = start + header
        while child < end:
            child += _der_length(data[:end], child)
        _require(child == end, "DER children overrun their parent")
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

    _require(_der_length(contents) == len(cms.ContentInfo.load(contents).dump()), "the CMS is not one DER value")
    info = cms.ContentInfo.load(contents)
    _require(info["content_type"].native == "signed_data", "the CMS is not SignedData")
    signed = info["content"]
    sha256 = [{"algorithm": "sha256", "parameters": None}]
    _require(signed["version"].native == "v1" and signed["digest_algorithms"].native == sha256
             and signed["encap_content_info"].native == {"content_type": "data", "content": None}
             and signed["crls"].native is None and len(signed["signer_infos"]) == 1,
             "the CMS SignedData fields are not reportgen's")
    certificates = signed["certificates"]
    _require(certificates.native is not None and len(certificates) == 1, "the CMS must carry exactly one certificate")
    cert = certificates[0].chosen
    signer = signed["signer_infos"][0]
    attrs = {a["type"].native: a["values"] for a in signer["signed_attrs"]}
    _require(signer["version"].native == "v1" and signer["sid"].name == "issuer_and_serial_number"
             and signer["sid"].chosen["issuer"] == cert.issuer
             and signer["sid"].chosen["serial_number"].native == cert.serial_number
             and signer["digest_algorithm"].native == sha256[0]
             and signer["signature_algorithm"]["algorithm"].native == "sha256_ecdsa"
             and signer["unsigned_attrs"].native is None
             and set(attrs) == {"content_type", "message_digest", "signing_certificate_v2"},
             "the CMS SignerInfo fields are not reportgen's")
    ess = attrs["signing_certificate_v2"][0]["certs"][0]
    _require(ess["hash_algorithm"]["algorithm"].native == "sha256"
             and ess["cert_hash"].native == hashlib.sha256(cert.dump()).digest(),
             "the signed signing-certificate attribute names another certificate")
    crypto_cert = x509.load_der_x509_certificate(cert.dump())
    try:
        crypto_cert.verify_directly_issued_by(crypto_cert)
    except Exception:  # noqa: BLE001 - InvalidSignature, ValueError, TypeError
        raise VerifyError("the certificate's self-signature does not verify") from None
    return "CMS layout as signed"


def check_pdf(data: bytes, public_key: ec.EllipticCurvePublicKey) -> PdfEvidence:
    """Checks 1-3 of a signed report.pdf (module docstring), and its attachments for the rest.

    Args:
        data: the PDF file.
        public_key: the reviewer's ``--key``.

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
        _require(len(signatures) == 1, f"{len(signatures)} signatures in the PDF, expected 1")
        state["reader"], state["signature"] = reader, signatures[0]
        return f"{len(data)} bytes, one signature field {signatures[0].field_name!r}"

    checks.append(_attempt("PDF signature found", read))
    if "signature" not in state:
        return PdfEvidence(data, {}, checks)
    signature = state["signature"]

    def pades() -> str:
        cert = signature.signer_cert
        context = ValidationContext(trust_roots=[cert], allow_fetching=False)
        status = validate_pdf_signature(signature, context)
        _require(status.intact, "the signed bytes were changed (digest mismatch)")
        _require(status.valid, "the CMS signature does not verify")
        _require(status.coverage == SignatureCoverageLevel.ENTIRE_FILE,
                 f"the signature covers {status.coverage.name}, not the entire file")
        _require(status.trusted and status.bottom_line, f"pyHanko's validator: {status.summary()}")
        return (f"PAdES, pyHanko validator: intact, valid; {_check_signature_bytes(data, signature)}; "
                f"{_check_cms(signature.pkcs7_content)}")

    def signer() -> str:
        from cryptography import x509

        cert = x509.load_der_x509_certificate(signature.signer_cert.dump())
        signed_by = fingerprint(cert.public_key())  # SHA-256 of the DER SubjectPublicKeyInfo
        _require(signed_by == fingerprint(public_key), f"signed with key {_short(signed_by)}, not the given key")
        return f"certificate key is the given key {_short(fingerprint(public_key))}"

    checks.append(_attempt("PDF signature", pades))
    checks.append(_attempt("PDF signer", signer))

    def attachments() -> str:
        state["files"] = files = _embedded_files(state["reader"])
        missing = {RESULTS_NAME, ENVELOPE_NAME} - set(files)
        _require(not missing, f"missing attachment(s): {', '.join(sorted(missing))}")
        return ", ".join(sorted(files))

    checks.append(_attempt("PDF attachments", attachments))
    return PdfEvidence(data, state.get("files", {}), checks)


def first_revision_digests(data: bytes) -> set[str]:
    """SHA-256 of every prefix of ``data`` that ends at an ``%%EOF`` marker (+ its EOL).

    The first revision of report.pdf is report.unsigned.pdf byte for byte; the statement
    gives its digest, so one of these prefixes must have it.
    """
    digests, start = set(), 0
    while (at := data.find(b"%%EOF", start)) >= 0:
        for end in (at + 5, at + 6, at + 7):
            digests.add(_sha256(data[:end]))
        start = at + 5
    return digests


# --------------------------------------------------------------------------- the statement


def check_envelope(raw: bytes, public_key: ec.EllipticCurvePublicKey) -> tuple[list[Check], dict | None]:
    """Checks 4-5: the envelope's layout and signature, and the statement's shape.

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
        _require(isinstance(envelope, dict) and set(envelope) == {"payload", "payloadType", "signatures"},
                 "not a DSSE envelope (payload, payloadType, signatures)")
        _require(envelope_file_bytes(envelope) == raw, "not in its canonical layout: the file was edited")
        _require(envelope["payloadType"] == PAYLOAD_TYPE, f"payloadType {envelope['payloadType']!r}")
        signatures = envelope["signatures"]
        _require(isinstance(signatures, list) and len(signatures) == 1
                 and set(signatures[0]) == {"keyid", "sig"}, "expected exactly one signature {keyid, sig}")
        payload = decode_b64(envelope["payload"])
        decode_b64(signatures[0]["sig"])
        try:
            Envelope.from_dict(copy.deepcopy(envelope)).verify([sslib_public_key(public_key)], 1)
        except Exception:  # noqa: BLE001 - securesystemslib's VerificationError and friends
            raise VerifyError(f"no valid signature by key {_short(fp)} "
                              f"(envelope names key {str(signatures[0]['keyid'])[:23]}...)") from None
        state["payload"] = payload
        return f"DSSE, key sha256:{fp}"

    def statement() -> str:
        _require("payload" in state, "not checked: the envelope signature did not verify")
        data = json.loads(state["payload"])
        _require(data.get("_type") == STATEMENT_TYPE, f"_type {data.get('_type')!r}, expected {STATEMENT_TYPE}")
        _require(data.get("predicateType") == PREDICATE_TYPE, f"predicateType {data.get('predicateType')!r}")
        subjects = data.get("subject")
        _require(isinstance(subjects, list) and subjects, "no subjects")
        for s in subjects:
            _require(isinstance(s.get("name"), str) and isinstance(s.get("digest", {}).get("sha256"), str),
                     f"malformed subject {s!r}")
        _require(len({s["name"] for s in subjects}) == len(subjects), "a subject is listed twice")
        predicate = data.get("predicate", {})
        _require(predicate.get("verdict") in ("PASS", "FAIL") and isinstance(predicate.get("required"), list),
                 "the predicate has no verdict or required checks")
        signer = predicate.get("signer", {}).get("publicKeySha256")
        _require(signer in (None, "", fp), f"the predicate names signer {signer}")
        state["statement"] = data
        return f"in-toto Statement v1, {len(subjects)} subjects, claim verdict {predicate['verdict']}"

    checks = [_attempt("envelope signature", signature), _attempt("statement", statement)]
    return checks, state.get("statement")


def _subject_digests(statement: dict) -> dict[str, str]:
    """``{subject name: sha256 hex}``."""
    return {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}


def status_mismatches(frame) -> list[str]:
    """Rows whose stated status is not the one their values give, one line each (empty = all agree).

    A row with a comparator must carry ``judge_record``'s status; a row without one may state
    only a fact (never PASS or FAIL); FLAGGED belongs to flagged experiments only.
    """
    flagged = flagged_names()
    problems = []
    for record in frame.to_dict("records"):
        record = {k: v for k, v in record.items() if not (isinstance(v, float) and v != v)}
        stated, name = record.get("status"), (f"{record.get('check')} / {record.get('item')} / "
                                              f"{record.get('variant')} / {record.get('metric')}")
        if record.get("comparator"):
            expected = judge_record(record)
            if expected != stated:
                problems.append(f"row {name} says {stated}, its value {record.get('value')!r} "
                                f"{record.get('comparator')} {record.get('threshold_value', record.get('threshold'))!r} "
                                f"gives {expected}")
        elif stated in (ROW_PASS, ROW_FAIL):
            problems.append(f"row {name} says {stated} without a comparison to derive it from")
        if (stated == FLAGGED) != (record.get("check") in flagged):
            problems.append(f"row {name} says {stated}, but only the flagged experiments "
                            f"({', '.join(sorted(flagged))}) are FLAGGED, and all their rows")
    return problems


def check_verdict(statement: dict, results: bytes) -> Check:
    """Check 8: every row's status follows from its signed numbers, and the statement's verdict
    follows from those statuses (``results.claim_verdict``)."""
    def recompute() -> str:
        predicate = statement["predicate"]
        frame = frame_from_json(results.decode())
        wrong = status_mismatches(frame)
        _require(not wrong, "; ".join(wrong[:3]) + (f" (and {len(wrong) - 3} more rows)" if len(wrong) > 3 else ""))
        recomputed = claim_verdict(frame, predicate["required"])
        _require(recomputed == predicate["verdict"],
                 f"the statement says {predicate['verdict']}, results.json gives {recomputed}")
        return f"statement {predicate['verdict']} = recomputed from the {len(frame)} row statuses of results.json " \
               f"(each recomputed from its value) with required checks {', '.join(predicate['required']) or '(none)'}"

    return _attempt("verdict", recompute)


# --------------------------------------------------------------------------- entry points


def _verify_pdf(data: bytes, public_key: ec.EllipticCurvePublicKey
                ) -> tuple[list[Check], dict[str, bytes], dict | None]:
    """Checks 1-8 of a lone report.pdf; also returns its attachments and the verified statement."""
    evidence = check_pdf(data, public_key)
    checks = list(evidence.checks)
    envelope = evidence.attachments.get(ENVELOPE_NAME)
    if envelope is None:
        return checks + [Check(FAIL, "envelope signature", "no statement.dsse.json attached in the PDF")], \
            evidence.attachments, None
    envelope_checks, statement = check_envelope(envelope, public_key)
    checks += envelope_checks
    if statement is None:
        return checks, evidence.attachments, None
    digests = _subject_digests(statement)
    results = evidence.attachments.get(RESULTS_NAME, b"")

    def attached_results() -> str:
        _require(RESULTS_NAME in digests, "the statement has no results.json subject")
        _require(_sha256(results) == digests[RESULTS_NAME], "the attached results.json is not the signed one")
        return f"attached in the PDF, {_short(digests[RESULTS_NAME])}"

    def pages() -> str:
        _require(UNSIGNED_PDF_NAME in digests, f"the statement has no {UNSIGNED_PDF_NAME} subject")
        _require(digests[UNSIGNED_PDF_NAME] in first_revision_digests(data),
                 f"the PDF's first revision is not the signed {UNSIGNED_PDF_NAME}")
        return f"the PDF's first revision is the signed {UNSIGNED_PDF_NAME}, {_short(digests[UNSIGNED_PDF_NAME])}"

    checks += [_attempt(f"attached {RESULTS_NAME}", attached_results), _attempt("rendered pages", pages)]
    if checks[-2].status == PASS:
        checks.append(check_verdict(statement, results))
    else:
        checks.append(Check(FAIL, "verdict", "not checked: the attached results.json is not the signed one"))
    return checks, evidence.attachments, statement


def verify_pdf(data: bytes, public_key: ec.EllipticCurvePublicKey) -> list[Check]:
    """All checks of a lone signed report.pdf (module docstring, 1-8), from the PDF alone.

    Args:
        data: the PDF file.
        public_key: the reviewer's ``--key``.

    Returns:
        One :class:`Check` per line printed.
    """
    return _verify_pdf(data, public_key)[0]


def _safe_relative(name: str) -> bool:
    """A subject name that stays inside the run folder (no absolute path, no ``..``)."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def verify_run_dir(run_dir: Path, public_key: ec.EllipticCurvePublicKey) -> list[Check]:
    """All checks of a run folder: the PDF's (when the run has one), the envelope on disk, every subject.

    Args:
        run_dir: the run's output folder.
        public_key: the reviewer's ``--key``.

    Returns:
        One :class:`Check` per line printed.
    """
    run_dir = Path(run_dir)
    envelope_path, pdf_path = run_dir / ENVELOPE_NAME, run_dir / PDF_NAME
    if not envelope_path.is_file():
        return [Check(FAIL, "envelope signature", f"no {ENVELOPE_NAME} in {run_dir}: the run was not signed "
                                                  "(report.sign=false?)")]
    envelope = envelope_path.read_bytes()
    checks: list[Check] = []
    statement = None
    if pdf_path.is_file():
        checks, attachments, statement = _verify_pdf(pdf_path.read_bytes(), public_key)
        same = attachments.get(ENVELOPE_NAME) == envelope
        checks.append(Check(PASS, f"{ENVELOPE_NAME} on disk", "is the envelope attached in report.pdf") if same else
                      Check(FAIL, f"{ENVELOPE_NAME} on disk", "differs from the envelope attached in report.pdf"))
        if not same:
            statement = None
    if statement is None:
        envelope_checks, statement = check_envelope(envelope, public_key)
        checks += [Check(c.status, f"{c.name} ({ENVELOPE_NAME} on disk)", c.detail) for c in envelope_checks]
    if statement is None:
        return checks
    digests = _subject_digests(statement)
    if not pdf_path.is_file():
        checks.append(Check(FAIL, PDF_NAME, "missing, but the statement covers a rendered PDF")
                      if UNSIGNED_PDF_NAME in digests else
                      Check(NOTE, PDF_NAME, "none in this run, made with report.pdf=false"))
    for name, digest in sorted(digests.items()):
        def subject(name=name, digest=digest) -> str:
            _require(_safe_relative(name), f"subject name {name!r} points outside the run folder")
            path = run_dir / name
            _require(path.is_file(), "missing")
            _require(_sha256(path.read_bytes()) == digest, "sha256 differs from the statement: the file was changed")
            return _short(digest)

        checks.append(_attempt(f"subject {name}", subject))
    if not pdf_path.is_file():
        results = run_dir / RESULTS_NAME
        checks.append(check_verdict(statement, results.read_bytes()) if results.is_file() and RESULTS_NAME in digests
                      else Check(FAIL, "verdict", "not checked: no signed results.json"))
    for name in run_files(run_dir):
        if name not in digests:
            checks.append(Check(NOTE, f"not covered: {name}", "not in the statement; nothing vouches for it"))
    return checks


def verify(target: Path, public_key: ec.EllipticCurvePublicKey) -> list[Check]:
    """Verify a run folder or a lone report.pdf.

    Args:
        target: a run folder, or a PDF file.
        public_key: the reviewer's ``--key``.

    Returns:
        One :class:`Check` per line; the report is verified when none is FAIL.

    Raises:
        FileNotFoundError: ``target`` does not exist.
    """
    target = Path(target)
    if target.is_dir():
        return verify_run_dir(target, public_key)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: no such file or folder")
    return verify_pdf(target.read_bytes(), public_key)


def main(argv: list[str] | None = None) -> int:
    """Command line: print one line per check, then a summary line.

    Returns:
        0 verified, 1 not verified, 2 usage error (no such path, unusable key).
    """
    parser = argparse.ArgumentParser(prog="python -m reportgen.verify",
                                     description="Verify a signed reportgen report offline.")
    parser.add_argument("target", help="a run folder (outputs/DATE/TIME) or a report.pdf")
    parser.add_argument("--key", required=True, help="the signer's public key (PEM), e.g. signing-key.pub.pem")
    args = parser.parse_args(argv)
    for noisy in ("pyhanko", "pyhanko_certvalidator", "securesystemslib", "fontTools"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        public_key = load_public_key(args.key)
        checks = verify(Path(args.target), public_key)
    except (KeyFileError, FileNotFoundError) as exc:
        print(f"reportgen.verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    failed = [c for c in checks if c.status == FAIL]
    lines = [c.line for c in checks]
    if failed:
        lines.append(f"NOT VERIFIED: {len(failed)} of {sum(c.status != NOTE for c in checks)} checks failed")
    else:
        lines.append(f"VERIFIED: all {len(checks) - sum(c.status == NOTE for c in checks)} checks hold "
                     f"(key sha256:{fingerprint(public_key)})")
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # `... | head`: the verdict is the exit code
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_NOT_VERIFIED if failed else EXIT_VERIFIED


if __name__ == "__main__":
    sys.exit(main())
