"""The PDF signature of a signed reportgen document (checks 1-3 of ``reportgen.verify``).

One PAdES signature by ``--key`` over the entire file, its CMS exactly in the layout
``pades.sign_pdf`` writes, and the attachments the remaining checks need; plus the digests of
the PDF's first revision (the rendered pages before signing).
"""

from __future__ import annotations

import binascii
import hashlib
import io
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.files import sha256_bytes
from reportgen.trust.attachments import embedded_files
from reportgen.trust.keys import fingerprint
from reportgen.verify.outcome import Check, VerifyError, attempt, require, short_digest


@dataclass
class PdfEvidence:
    """What a signed report.pdf carries: its attachments by name, and check results."""

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
    require(
        start2 + len2 == len(data),
        f"/ByteRange ends at byte {start2 + len2}, the file at {len(data)}: bytes after the signed range",
    )
    contents = signature.pkcs7_content
    require(
        data[len1:start2] == b"<" + binascii.hexlify(contents).upper() + b">",
        "/Contents is not the signed range's exact complement",
    )
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
        length = int.from_bytes(data[start + 2 : start + 2 + count], "big")
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
    """The CMS in /Contents has exactly the layout ``pades.sign_pdf`` makes, and its certificate is genuine.

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
    require(
        signed["version"].native == "v1"
        and signed["digest_algorithms"].native == sha256
        and signed["encap_content_info"].native == {"content_type": "data", "content": None}
        and signed["crls"].native is None
        and len(signed["signer_infos"]) == 1,
        "the CMS SignedData fields are not reportgen's",
    )
    certificates = signed["certificates"]
    require(certificates.native is not None and len(certificates) == 1, "the CMS must carry exactly one certificate")
    cert = certificates[0].chosen
    signer = signed["signer_infos"][0]
    attrs = {a["type"].native: a["values"] for a in signer["signed_attrs"]}
    require(
        signer["version"].native == "v1"
        and signer["sid"].name == "issuer_and_serial_number"
        and signer["sid"].chosen["issuer"] == cert.issuer
        and signer["sid"].chosen["serial_number"].native == cert.serial_number
        and signer["digest_algorithm"].native == sha256[0]
        and signer["signature_algorithm"]["algorithm"].native == "sha256_ecdsa"
        and signer["unsigned_attrs"].native is None
        and set(attrs) == {"content_type", "message_digest", "signing_certificate_v2"},
        "the CMS SignerInfo fields are not reportgen's",
    )
    ess = attrs["signing_certificate_v2"][0]["certs"][0]
    require(
        ess["hash_algorithm"]["algorithm"].native == "sha256"
        and ess["cert_hash"].native == hashlib.sha256(cert.dump()).digest(),
        "the signed signing-certificate attribute names another certificate",
    )
    crypto_cert = x509.load_der_x509_certificate(cert.dump())
    try:
        crypto_cert.verify_directly_issued_by(crypto_cert)
    except Exception:  # noqa: BLE001 - InvalidSignature, ValueError, TypeError
        raise VerifyError("the certificate's self-signature does not verify") from None
    return "CMS layout as signed"


def check_pdf(data: bytes, public_key: ec.EllipticCurvePublicKey, required: tuple[str, ...]) -> PdfEvidence:
    """Checks 1-3 of a signed PDF (``reportgen.verify``): one whole-file PAdES signature by
    ``--key``, and the attachments the rest of the checks need.

    ``required``: the attachments that must be present (a run's report.pdf: results.json and the envelope; a
    sweep's summary.pdf: summary.json and the envelope). The evidence's ``attachments`` is empty when the PDF
    could not be read.
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
        return PdfEvidence({}, checks)
    signature = state["signature"]

    def pades() -> str:
        context = ValidationContext(trust_roots=[signature.signer_cert], allow_fetching=False)
        status = validate_pdf_signature(signature, context)
        require(status.intact, "the signed bytes were changed (digest mismatch)")
        require(status.valid, "the CMS signature does not verify")
        require(
            status.coverage == SignatureCoverageLevel.ENTIRE_FILE,
            f"the signature covers {status.coverage.name}, not the entire file",
        )
        require(status.trusted and status.bottom_line, f"pyHanko's validator: {status.summary()}")
        return (
            f"PAdES, pyHanko validator: intact, valid; {_check_signature_bytes(data, signature)}; "
            f"{_check_cms(signature.pkcs7_content)}"
        )

    def signer() -> str:
        from cryptography import x509

        key = x509.load_der_x509_certificate(signature.signer_cert.dump()).public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):  # an abstract class: of_type cannot name it for mypy
            raise VerifyError(f"the certificate's key is {type(key).__name__}, not an ECDSA key")
        signed_by = fingerprint(key)  # SHA-256 of the DER SubjectPublicKeyInfo
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
    return PdfEvidence(state.get("files", {}), checks)


def first_revision_digests(data: bytes) -> set[str]:
    """SHA-256 of every prefix of ``data`` that ends at an ``%%EOF`` marker (+ its EOL).

    The first revision of report.pdf is report.unsigned.pdf byte for byte; the statement
    gives its digest, so one of these prefixes must have it.
    """
    digests, start = set(), 0
    while (at := data.find(b"%%EOF", start)) >= 0:
        for end in (at + 5, at + 6, at + 7):
            digests.add(sha256_bytes(data[:end]))
        start = at + 5
    return digests
