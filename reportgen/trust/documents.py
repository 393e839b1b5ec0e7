"""What a signed reportgen document is made of: its file names and its statement's types, one
:class:`DocumentSpec` per kind read by signer and verifier alike (a run here; a sweep summary in
``reportgen.sweep.summary``, a comparison in ``reportgen.verify.comparison``)."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, kw_only=True, slots=True)
class DocumentSpec:
    """The files of one kind of signed document in its folder, and what its predicate means.

    Attributes:
        envelope: the DSSE envelope, e.g. ``statement.dsse.json``.
        pdf: the signed PDF, e.g. ``report.pdf`` (the rendered PDF plus the attached envelope and a
            PAdES signature).
        unsigned: the rendered PDF before signing, e.g. ``report.unsigned.pdf`` (a statement subject).
        data: the data file attached in the PDF and listed as a subject, e.g. ``results.json``.
        predicate_type: the statement's ``predicateType`` (a URI).
    """

    envelope: str
    pdf: str
    unsigned: str
    data: str
    predicate_type: str

    @classmethod
    def named(cls, stem: str, predicate_type: str) -> DocumentSpec:
        """A document whose files share ``stem``: ``<stem>.dsse.json``, ``<stem>.pdf``,
        ``<stem>.unsigned.pdf`` and ``<stem>.json`` (a sweep summary, a comparison)."""
        return cls(
            envelope=f"{stem}.dsse.json",
            pdf=f"{stem}.pdf",
            unsigned=f"{stem}.unsigned.pdf",
            data=f"{stem}.json",
            predicate_type=predicate_type,
        )


#: A run: report.pdf over results.json.
RUN_DOCUMENT = DocumentSpec(
    envelope=ENVELOPE_NAME,
    pdf=PDF_NAME,
    unsigned=UNSIGNED_PDF_NAME,
    data=RESULTS_NAME,
    predicate_type=PREDICATE_TYPE,
)
