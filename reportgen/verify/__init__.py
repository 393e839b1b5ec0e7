"""``python -m reportgen.verify TARGET --key PUB``: check anything reportgen signed, offline.

TARGET is a run folder or its report.pdf, a sweep folder or its summary.pdf, or a comparison
folder or its compare.pdf; the first line says which kind was found. One line per check,
``PASS ...`` or ``FAIL ...`` (``NOTE`` lines inform and never fail); the last line says
VERIFIED or NOT VERIFIED and what was verified, and for a verified run whether its signed claim
holds, fails or is INCONCLUSIVE (``VERIFIED (run folder): the signed claim FAILS; ...``).

``--expect run|sweep|comparison`` (what a CI gate passes) fails any other kind; the kind is the
verified statement's predicate type, never a file name, and a folder holding the files of two
kinds fails. The first and the last line both name the kind found.

Exit codes: 0 verified (whatever the verified claim says: a signed FAIL verified is exit 0,
its last line says FAILS); 1 not verified (a forgery, an edit, a missing or swapped file, another
key); 2 the command cannot start (no such path, unusable key); 3 verified, and what it
verifies is a run whose claim cannot be judged (INCONCLUSIVE), so that an honest INCONCLUSIVE
run is told apart from a forgery.

Checks, for a lone signed PDF (everything comes from inside the PDF; ``reportgen.verify.common``):

1. the PDF signature: exactly one; pyHanko's validator (``validate_pdf_signature``, the
   embedded certificate as the only trust root) finds it intact, valid and trusted; it
   covers the entire file (/ByteRange from byte 0 to the last byte) and its /Contents is
   exactly the hex that pyHanko writes (upper case, zero padding), so no byte of the file
   can change unnoticed;
2. the certificate that made it holds the ``--key`` public key;
3. the attachments (the data file and statement.dsse.json) are present, once each;
4. the DSSE envelope is in its one canonical layout and its signature verifies with
   ``--key`` (securesystemslib);
5. the statement is an in-toto Statement v1 with the predicate type of its kind;
6. the attached data file has the digest the statement gives it;
7. the PDF's first revision (the rendered pages before signing) has the digest of the
   statement's unsigned-PDF subject;
8. what the data states follows from what it is made of: for a run (``.run``), every row's
   status recomputed from its signed value, threshold and comparator equals the status it
   states, then the verdict recomputed from those statuses, then each clause of a signed release
   claim (``claim=<name>``) re-derived from the checks' signed rows (``.claim``), then the statement's tolerances
   re-derived from the parity rows (``.run.check_tolerances``); for a sweep (``.sweep``), every
   job verifies on its own and the summary re-derived from the jobs' signed files equals the
   signed summary; for a comparison (``.comparison``), both runs verify and the comparison
   re-derived from them equals the signed one.

For a folder, additionally: the envelope on disk is the one attached in the PDF, and every
subject of the statement exists with its digest; a run's verdict.json (written after signing)
names the envelope's SHA-256 and agrees with the signed verdict and clauses. Other files of a
run folder that the statement does not list are named in ``NOTE`` lines: nothing vouches for them.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.errors import ExitCode
from reportgen.files import NotRegularFile, refuse_special
from reportgen.results import Status
from reportgen.sweep import INCOMPLETE_MARK
from reportgen.trust.attachments import read_attachments
from reportgen.trust.documents import ENVELOPE_NAME, PREDICATE_TYPE
from reportgen.trust.keys import KeyFileError, fingerprint, load_public_key
from reportgen.verify.common import Document, peek_predicate_type
from reportgen.verify.comparison import COMPARISON, verify_comparison, verify_comparison_pdf
from reportgen.verify.outcome import FAIL, NOTE, Check
from reportgen.verify.run import RUN, verify_run, verify_run_pdf
from reportgen.verify.sweep import SUMMARY, verify_summary, verify_sweep

#: Each kind of signed document with its folder and PDF verifiers (each returns ``Verified``).
KINDS = {
    RUN.predicate_type: (RUN, verify_run, verify_run_pdf),
    SUMMARY.predicate_type: (SUMMARY, verify_sweep, verify_summary),
    COMPARISON.predicate_type: (COMPARISON, verify_comparison, verify_comparison_pdf),
}


@dataclass
class Outcome:
    """What ``reportgen.verify`` found: the kind of document, its check lines, and the claim
    verdict its statement gives (a run's; ``None`` for other kinds or when unverified)."""

    kind: str
    checks: list[Check]
    verdict: str | None = None


#: The signed run's claim, first on the last line, so a reviewer reading only that line sees the verdict.
SIGNED_CLAIM: dict[str, str] = {
    Status.PASS: "the signed claim HOLDS; ",
    Status.FAIL: "the signed claim FAILS; ",
    Status.INCONCLUSIVE: "the signed claim is INCONCLUSIVE (honestly signed, and it cannot be judged: exit 3); ",
}
#: What ``--expect`` accepts: each kind's label.
EXPECT = tuple(doc.label for doc, _, _ in KINDS.values())


def kinds_in_folder(folder: Path) -> list[Document]:
    """The kinds whose own files (envelope, PDF, unsigned PDF, data file) lie at the top of ``folder``."""
    return [
        doc
        for doc, _, _ in KINDS.values()
        if any(
            (folder / name).exists() or (folder / name).is_symlink()
            for name in (doc.envelope, doc.pdf, doc.unsigned, doc.data)
        )
    ]


def kind_of(target: Path) -> Document:
    """Which verifier to run on ``target``: a folder's one kind of files, a PDF's attached envelope.

    The envelope's claimed type only chooses the verifier; that verifier then checks the type
    under the signature, so the kind reported is the verified statement's. Unknown or
    unreadable: a run (its checks then say what is wrong).
    """
    if target.is_dir():
        found = kinds_in_folder(target)
        return found[0] if len(found) == 1 else RUN
    try:
        envelope = read_attachments(target.read_bytes()).get(ENVELOPE_NAME, b"")
    except Exception:  # noqa: BLE001 - an unreadable PDF: the run verifier names what is wrong
        return RUN
    return KINDS.get(peek_predicate_type(envelope) or PREDICATE_TYPE, KINDS[PREDICATE_TYPE])[0]


def mixed_kinds(folder: Path, found: list[Document]) -> Check:
    """The FAIL line for a folder holding the files of two kinds of document."""
    parts = [
        f"a {doc.label} ({', '.join(n for n in (doc.envelope, doc.pdf, doc.unsigned, doc.data) if (folder / n).exists())})"
        for doc in found
    ]
    return Check(
        FAIL,
        "kind",
        f"this folder holds the files of {' and of '.join(parts)}; a signed folder holds one "
        "kind of document: verify each in a folder of its own",
    )


def verify_target(target: Path, public_key: ec.EllipticCurvePublicKey, expect: str | None = None) -> Outcome:
    """Verify a run, sweep or comparison, as a folder or a lone PDF, with the reviewer's ``--key``.

    ``expect`` is ``--expect``: ``"run"``, ``"sweep"`` or ``"comparison"``; any other kind found (from the
    verified statement's predicate type) fails.

    Raises:
        FileNotFoundError: ``target`` does not exist.
        NotRegularFile: ``target`` (or a file it is made of) is a device, FIFO or socket.
    """
    target = Path(target)
    if not target.exists():
        raise FileNotFoundError(f"{target}: no such file or folder")
    refuse_special(target)
    where = "folder" if target.is_dir() else "PDF"
    if target.is_dir() and len(found := kinds_in_folder(target)) > 1:
        return Outcome("mixed folder", [mixed_kinds(target, found)])
    if target.is_dir() and (target / INCOMPLETE_MARK).is_file() and not (target / SUMMARY.envelope).is_file():
        said = f"{INCOMPLETE_MARK} is present and there is no {SUMMARY.envelope}: the summary was interrupted; "
        said += f"write it again with python -m reportgen.sweep summarize {target}"
        return Outcome("sweep folder", [Check(FAIL, "summary complete", said)])
    doc = kind_of(target)
    _, on_dir, on_pdf = KINDS[doc.predicate_type]
    verified = on_dir(target, public_key) if target.is_dir() else on_pdf(target.read_bytes(), public_key)
    checks = verified.checks
    verdict = None
    if doc is RUN and verified.statement is not None and not any(c.status == FAIL for c in checks):
        verdict = verified.statement["predicate"]["verdict"]
    if expect is not None and expect != doc.label:
        said = f"--expect {expect}, and this is a {doc.label} {where}"
        checks.append(Check(FAIL, "expected kind", f"{said} (its statement's predicate type {doc.predicate_type})"))
    return Outcome(f"{doc.label} {where}", checks, verdict)


def verify(target: Path, public_key: ec.EllipticCurvePublicKey) -> list[Check]:
    """Verify a run, sweep or comparison folder or PDF; one :class:`Check` per line.

    Raises:
        FileNotFoundError: ``target`` does not exist.
    """
    return verify_target(target, public_key).checks


def main(argv: list[str] | None = None) -> int:
    """Command line: what was found, one line per check, then a summary line; the exit code (module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m reportgen.verify", description="Verify a signed reportgen run, sweep or comparison offline."
    )
    parser.add_argument(
        "target",
        help="a run folder (outputs/DATE/TIME) or report.pdf, a sweep folder or summary.pdf, "
        "a comparison folder or compare.pdf",
    )
    parser.add_argument("--key", required=True, help="the signer's public key (PEM), e.g. signing-key.pub.pem")
    parser.add_argument(
        "--expect", choices=EXPECT, help="the kind TARGET must be (CI gates: --expect run); any other kind found fails"
    )
    args = parser.parse_args(argv)
    for noisy in ("pyhanko", "pyhanko_certvalidator", "securesystemslib", "fontTools"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        refuse_special(Path(args.key))
        public_key = load_public_key(args.key)
        outcome = verify_target(Path(args.target), public_key, args.expect)
    except (KeyFileError, FileNotFoundError, NotRegularFile) as exc:
        print(f"reportgen.verify: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    checks = outcome.checks
    failed = [c for c in checks if c.status == FAIL]
    lines = [f"checking a {outcome.kind}: {args.target}", *(c.line for c in checks)]
    if failed:
        lines.append(
            f"NOT VERIFIED ({outcome.kind}): {len(failed)} of {sum(c.status != NOTE for c in checks)} checks failed"
        )
    else:
        lines.append(
            f"VERIFIED ({outcome.kind}): {SIGNED_CLAIM.get(outcome.verdict or '', '')}"
            f"all {len(checks) - sum(c.status == NOTE for c in checks)} checks hold "
            f"(key sha256:{fingerprint(public_key)})"
        )
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # `... | head`: the verdict is the exit code
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if failed:
        return ExitCode.FAILS
    return ExitCode.INCONCLUSIVE if outcome.verdict == Status.INCONCLUSIVE else ExitCode.HOLDS
