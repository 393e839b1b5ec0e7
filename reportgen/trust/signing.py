"""Sign a document: an in-toto statement in a DSSE envelope, and a PAdES signature on its PDF.

:func:`sign` is the one path for runs (:func:`sign_run`), sweep summaries and comparisons; ``reportgen.verify``
checks what it writes, in the order written here. The parts: ``documents`` (file names), ``keys`` (the key),
``statement`` (statement, predicate, envelope) and ``pades`` (the signed PDF).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from reportgen.files import atomic_write, record_written
from reportgen.trust.documents import RUN_DOCUMENT, DocumentSpec
from reportgen.trust.keys import SigningKey
from reportgen.trust.pades import sign_pdf
from reportgen.trust.statement import build_statement, claim_predicate, sign_statement


def sign(
    out_dir: Path,
    doc: DocumentSpec,
    predicate: dict,
    key: SigningKey | None,
    reason: str,
    subjects: Iterable[str] | None = None,
) -> dict[str, Path]:
    """Sign a document in ``out_dir``: the one path for runs, sweep summaries and comparisons.

    ``doc.pdf`` (as rendered) becomes ``doc.unsigned``; ``doc.envelope`` is a DSSE envelope around
    an in-toto Statement v1 (``doc.predicate_type``) over the subjects; ``doc.pdf`` is the unsigned
    PDF plus the attached envelope and a PAdES signature. Does nothing when ``key`` is ``None``.

    Args:
        out_dir: folder the document and its subjects live in.
        doc: the document's files and predicate type.
        predicate: the statement's predicate (strict JSON: no NaN).
        key: from :func:`reportgen.trust.keys.load_signing_key`.
        reason: the PDF signature's /Reason (shown by PDF viewers).
        subjects: POSIX paths relative to ``out_dir`` (missing ones are skipped; the unsigned PDF
            is added); ``None``: every file the run wrote (:func:`run_files`).

    Returns:
        ``{"statement": path, "pdf": path}`` of what was written (``pdf`` only with a PDF).

    Raises:
        FileExistsError: a signed output exists already (outputs never overwrite a run).
    """
    if key is None:
        return {}
    out_dir = Path(out_dir)
    pdf, unsigned = out_dir / doc.pdf, out_dir / doc.unsigned
    if pdf.exists():  # the rendered PDF is set aside as ``doc.unsigned``, a statement subject
        if unsigned.exists():
            raise FileExistsError(f"{unsigned} exists already; reportgen never overwrites an earlier run")
        os.replace(pdf, unsigned)
        record_written(unsigned)
    if subjects is not None:
        named = {*subjects, *([unsigned.name] if unsigned.exists() else [])}
        subjects = [n for n in sorted(named) if (out_dir / n).is_file()]
    envelope = sign_statement(build_statement(out_dir, predicate, subjects, doc.predicate_type), key)
    paths = {"statement": atomic_write(out_dir / doc.envelope, envelope)}
    if unsigned.exists():
        paths["pdf"] = atomic_write(pdf, sign_pdf(unsigned.read_bytes(), envelope, key, reason))
    return paths


def sign_run(
    frame: pd.DataFrame, meta: dict, verdict: str, out_dir: Path, key: SigningKey | None, required: Iterable[str]
) -> dict[str, Path]:
    """Sign everything the run wrote (:func:`sign` with :func:`claim_predicate`): statement.dsse.json,
    then the signed report.pdf; the unsigned PDF becomes ``report.unsigned.pdf``, a statement subject.
    Nothing when ``key`` is ``None`` (signing off: report.pdf stays the unsigned PDF/A).

    ``frame``, ``meta``, ``verdict``, ``required`` are as for :func:`claim_predicate`; ``out_dir`` (the run
    folder, results and report written already), ``key``, what it returns and raises as for :func:`sign`.
    """
    if key is None:
        return {}
    predicate = claim_predicate(frame, meta, verdict, required)
    reason = f"reportgen activation-recomputation report; claim verdict {verdict}"
    return sign(out_dir, RUN_DOCUMENT, predicate, key, reason)
