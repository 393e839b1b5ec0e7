"""What every signed reportgen document shares: DSSE envelope, statement, subjects, and the folder or PDF it comes in.

The run, sweep and comparison verifiers build on these checks (offline: nothing touches the network).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.files import sha256_bytes, sha256_file, special_kind
from reportgen.trust.attachments import read_attachments
from reportgen.trust.documents import ENVELOPE_NAME, PAYLOAD_TYPE, STATEMENT_TYPE, DocumentSpec
from reportgen.trust.keys import fingerprint
from reportgen.trust.statement import decode_b64, envelope_file_bytes, sslib_public_key
from reportgen.verify.outcome import FAIL, NOTE, PASS, Check, VerifyError, attempt, require, short_digest
from reportgen.verify.pdf import check_pdf, first_revision_digests


def check_envelope(raw: bytes, public_key: ec.EllipticCurvePublicKey, doc: Document) -> tuple[list[Check], dict | None]:
    """Checks 4-5 of the envelope file's bytes ``raw``: its layout and signature by the reviewer's ``--key``, and
    the statement's shape for the kind of document ``doc`` (its ``predicate_type`` and ``check_predicate``).
    Returns the checks and the statement (``None`` unless the signature verified)."""
    from securesystemslib.dsse import Envelope

    state: dict = {}
    fp = fingerprint(public_key)

    def signature() -> str:
        try:
            envelope = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise VerifyError(f"not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
        require(
            isinstance(envelope, dict) and set(envelope) == {"payload", "payloadType", "signatures"},
            "not a DSSE envelope (payload, payloadType, signatures)",
        )
        require(envelope_file_bytes(envelope) == raw, "not in its canonical layout: the file was edited")
        require(envelope["payloadType"] == PAYLOAD_TYPE, f"payloadType {envelope['payloadType']!r}")
        signatures = envelope["signatures"]
        require(
            isinstance(signatures, list) and len(signatures) == 1 and set(signatures[0]) == {"keyid", "sig"},
            "expected exactly one signature {keyid, sig}",
        )
        payload = decode_b64(envelope["payload"])
        decode_b64(signatures[0]["sig"])
        try:
            Envelope.from_dict(copy.deepcopy(envelope)).verify([sslib_public_key(public_key)], 1)
        except Exception:  # noqa: BLE001 - securesystemslib's VerificationError and friends
            raise VerifyError(
                f"no valid signature by key {short_digest(fp)} "
                f"(envelope names key {str(signatures[0]['keyid'])[:23]}...)"
            ) from None
        state["payload"] = payload
        return f"DSSE, key sha256:{fp}"

    def statement() -> str:
        require("payload" in state, "not checked: the envelope signature did not verify")
        data = json.loads(state["payload"])
        require(data.get("_type") == STATEMENT_TYPE, f"_type {data.get('_type')!r}, expected {STATEMENT_TYPE}")
        require(
            data.get("predicateType") == doc.predicate_type,
            f"predicateType {data.get('predicateType')!r}, expected {doc.predicate_type}",
        )
        subjects = data.get("subject")
        require(isinstance(subjects, list) and subjects, "no subjects")
        for s in subjects:
            require(
                isinstance(s.get("name"), str) and isinstance(s.get("digest", {}).get("sha256"), str),
                f"malformed subject {s!r}",
            )
        require(len({s["name"] for s in subjects}) == len(subjects), "a subject is listed twice")
        predicate = data.get("predicate", {})
        require(isinstance(predicate, dict), "the predicate is not an object")
        signer = predicate.get("signer", {}).get("publicKeySha256")
        require(signer in (None, "", fp), f"the predicate names signer {signer}")
        detail = doc.check_predicate(predicate)
        state["statement"] = data
        return f"in-toto Statement v1, {len(subjects)} subjects, {detail}"

    return [attempt("envelope signature", signature), attempt("statement", statement)], state.get("statement")


def subject_digests(statement: dict) -> dict[str, str]:
    """``{subject name: sha256 hex}``."""
    return {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}


def safe_relative(name: str) -> bool:
    """A subject name that stays inside the run folder (no absolute path, no ``..``)."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def check_subjects(folder: Path, digests: dict[str, str]) -> list[Check]:
    """One check per statement subject of ``digests`` (:func:`subject_digests`): it stays inside ``folder`` (the run,
    sweep or comparison folder its name is relative to), exists, and has its digest."""
    checks = []
    for name, digest in sorted(digests.items()):

        def subject(name=name, digest=digest) -> str:
            require(safe_relative(name), f"subject name {name!r} points outside the folder")
            path = Path(folder) / name
            require(
                path.resolve().is_relative_to(Path(folder).resolve()),
                f"a symbolic link leaving the folder (to {path.resolve()}): never followed",
            )
            require(special_kind(path) is None, f"{special_kind(path)}, not a regular file")
            require(path.is_file(), "missing")
            require(sha256_file(path) == digest, "sha256 differs from the statement: the file was changed")
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


def unlisted_files(
    run_dir: Path, listed, own: tuple[str, ...] = ("report.pdf", ENVELOPE_NAME)
) -> list[tuple[str, str]]:
    """Everything in the folder ``run_dir`` that the statement's subject names ``listed`` do not list, logs and
    dotfiles included, but ``own`` (the signed outputs themselves, PDF and envelope, checked on their own); symbolic
    links are named and never followed. Returns ``(relative POSIX path, kind prefix)`` pairs, sorted; the prefix is
    ``""`` for a regular file, else e.g. ``"a symbolic link, "``."""
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


@dataclass(frozen=True, kw_only=True)
class Document(DocumentSpec):
    """One kind of signed reportgen document (a run, a sweep summary, a comparison): the signer's own
    files and predicate type (``reportgen.trust.documents``, so signer and verifier name the same files),
    and how verify names and checks it.

    Attributes:
        label: what verify says it checked, e.g. ``"run"``.
        check_predicate: ``fn(predicate) -> detail``; raises :class:`VerifyError` when the
            predicate lacks what this kind must state.
    """

    label: str
    check_predicate: Callable[[dict], str]

    @classmethod
    def of(cls, label: str, spec: DocumentSpec, check_predicate: Callable[[dict], str]) -> Document:
        """The document whose files and predicate type are ``spec``'s."""
        return cls(label=label, check_predicate=check_predicate, **asdict(spec))


@dataclass
class Verified:
    """What verifying one document found: the check lines, the verified statement (or None),
    and the bytes of its data file that the statement vouches for (or None)."""

    checks: list[Check]
    statement: dict | None = None
    data: bytes | None = None


def verify_lone_pdf(
    pdf: bytes, public_key: ec.EllipticCurvePublicKey, doc: Document, item: str, said: Callable[[dict], str]
) -> Verified:
    """A lone PDF of a document made from runs: its own checks (:func:`verify_signed_pdf`), and a NOTE
    ``item``, ``said(statement)``: what it names needs its folder to be checked."""
    found = verify_signed_pdf(pdf, public_key, doc)[0]
    if found.statement is not None:
        found.checks.append(Check(NOTE, item, said(found.statement)))
    return found


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
    envelope_checks, found.statement = check_envelope(envelope, public_key, doc)
    found.checks += envelope_checks
    if found.statement is None:
        return found, evidence.attachments
    digests = subject_digests(found.statement)
    data = evidence.attachments.get(doc.data, b"")

    def attached_data() -> str:
        require(doc.data in digests, f"the statement has no {doc.data} subject")
        require(sha256_bytes(data) == digests[doc.data], f"the attached {doc.data} is not the signed one")
        return f"attached in the PDF, {short_digest(digests[doc.data])}"

    def pages() -> str:
        require(doc.unsigned in digests, f"the statement has no {doc.unsigned} subject")
        require(
            digests[doc.unsigned] in first_revision_digests(pdf),
            f"the PDF's first revision is not the signed {doc.unsigned}",
        )
        return f"the PDF's first revision is the signed {doc.unsigned}, {short_digest(digests[doc.unsigned])}"

    found.checks += [attempt(f"attached {doc.data}", attached_data), attempt("rendered pages", pages)]
    if found.checks[-2].status == PASS:
        found.data = data
    return found, evidence.attachments


def _why_unsigned(folder: Path, doc: Document) -> str:
    """Why a folder has no envelope: a finished run never signed, a deleted statement, or signing off."""
    from reportgen.trust.manifest import PENDING_NAME, SIGN_COMMAND

    if (folder / PENDING_NAME).is_file():
        return (
            f"the {doc.label} finished its checks but was interrupted before it was signed ({PENDING_NAME}); "
            f"render and sign it with {SIGN_COMMAND} {folder}"
        )
    pdf = folder / doc.pdf
    if pdf.is_file():
        try:
            if ENVELOPE_NAME in read_attachments(pdf.read_bytes()):
                return (
                    f"it was deleted: {doc.pdf} beside it is signed and carries the statement; verify {doc.pdf} "
                    "alone, or restore the folder"
                )
        except Exception:  # noqa: BLE001 - an unreadable PDF: fall through to the generic reason
            pass
    return f"the {doc.label} was not signed (report.sign=false?)"


def verify_document_dir(
    folder: Path, public_key: ec.EllipticCurvePublicKey, doc: Document, note_unlisted: bool = True
) -> Verified:
    """A folder (run, sweep or comparison) holding a signed document of kind ``doc``, checked with the reviewer's
    ``--key``: its PDF (when there is one), the envelope on disk (the one attached in the PDF), and every subject's
    digest; ``note_unlisted`` adds a NOTE per file the statement does not list. The result's ``data`` holds the
    data file's bytes when the statement vouches for them."""
    folder = Path(folder)
    envelope_path, pdf_path = folder / doc.envelope, folder / doc.pdf
    if not envelope_path.is_file():
        return Verified(
            [Check(FAIL, "envelope signature", f"no {doc.envelope} in {folder}: {_why_unsigned(folder, doc)}")]
        )
    envelope = envelope_path.read_bytes()
    found = Verified([])
    if pdf_path.is_file():
        found, attachments = verify_signed_pdf(pdf_path.read_bytes(), public_key, doc)
        same = attachments.get(ENVELOPE_NAME) == envelope
        found.checks.append(
            Check(PASS, f"{doc.envelope} on disk", f"is the envelope attached in {doc.pdf}")
            if same
            else Check(FAIL, f"{doc.envelope} on disk", f"differs from the envelope attached in {doc.pdf}")
        )
        if not same:
            found.statement, found.data = None, None
    if found.statement is None:
        envelope_checks, found.statement = check_envelope(envelope, public_key, doc)
        found.checks += [Check(c.status, f"{c.name} ({doc.envelope} on disk)", c.detail) for c in envelope_checks]
    if found.statement is None:
        return found
    digests = subject_digests(found.statement)
    if not pdf_path.is_file():
        found.checks.append(
            Check(FAIL, doc.pdf, "missing, but the statement covers a rendered PDF")
            if doc.unsigned in digests
            else Check(NOTE, doc.pdf, f"none in this {doc.label}, made with report.pdf=false")
        )
    subject_checks = check_subjects(folder, digests)
    found.checks += subject_checks
    if (
        found.data is None
        and doc.data in digests
        and all(c.status == PASS for c in subject_checks if c.name == f"subject {doc.data}")
    ):
        found.data = (folder / doc.data).read_bytes()
    if note_unlisted:
        for name, kind in unlisted_files(folder, digests, own=(doc.pdf, doc.envelope)):
            found.checks.append(
                Check(NOTE, f"not covered: {name}", f"{kind}not in the statement; nothing vouches for it")
            )
    return found
