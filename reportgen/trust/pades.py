"""The PAdES signature on a document's PDF (pyHanko): the DSSE envelope attached in the PDF/A-3 and
a signature made with a self-signed X.509 certificate for the signing key, in one incremental update."""

from __future__ import annotations

import datetime as dt
import io

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from reportgen.trust.documents import ENVELOPE_NAME
from reportgen.trust.keys import SigningKey

#: Name of the PDF signature field.
SIGNATURE_FIELD = "reportgen"


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
    others = "key_encipherment data_encipherment key_agreement key_cert_sign crl_sign encipher_only decipher_only"
    granted = dict.fromkeys(("digital_signature", "content_commitment"), True)
    usage = x509.KeyUsage(**granted, **dict.fromkeys(others.split(), False))
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

    ``unsigned`` is the PDF/A-3b from ``render.write_pdf``; ``envelope`` the statement.dsse.json bytes, attached
    as ``statement.dsse.json``; ``reason`` the signature's /Reason (shown by PDF viewers). Returns the signed PDF.

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
