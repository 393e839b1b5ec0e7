"""Verify the release claim of a run (``claim=<name>``) and its verdict.json.

- ``release claim``: the clause rows of the signed results.json are exactly the clauses of the
  signed claim (same text, metric, comparator and bound, in order), and each row's value and
  status equal those re-derived from the signed frame (:func:`reportgen.claim.rows.clause_rows`
  on the checks' rows; a ``fits`` clause's prediction from its own recorded figures), and the
  ``claim_sentence`` row names exactly the signed claim's unjudged quantities. A run without a
  signed claim has no clause rows.
- ``verdict.json``: written after signing, it names the statement's SHA-256; it must name the
  envelope on disk and agree with the signed verdict and clause results
  (:func:`reportgen.ci.verdict.verdict_problems`).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from reportgen.ci.verdict import VERDICT_NAME, verdict_problems
from reportgen.claim import claim_from_record, clause_rows
from reportgen.claim.clauses import FITS
from reportgen.claim.rows import not_judged, sentence_rows
from reportgen.config import RELEASE_CLAIM
from reportgen.results import Role, to_frame
from reportgen.verify.outcome import FAIL, PASS, Check, require


def _same(a, b) -> bool:
    """Equal numbers (NaN equals NaN) or equal text."""
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return a == b
    return (math.isnan(a) and math.isnan(b)) or a == b


def _fits_figures(rows: pd.DataFrame) -> dict[str, dict]:
    """The recorded figures of each ``fits`` clause row: the prediction it was judged on."""
    out = {}
    for r in rows[rows.get("clause_kind") == FITS].to_dict("records") if "clause_kind" in rows.columns else []:
        predicted = r.get("predicted_bytes")
        out[r["item"]] = (
            {"predicted_bytes": predicted, "method": r.get("fits_method") or ""}
            if predicted is not None and not _same(predicted, math.nan)
            else {"error": r["detail"]}
        )
    return out


def check_claim(predicate: dict, frame: pd.DataFrame) -> str:
    """The clause rows agree with the signed claim and re-derive from the signed frame."""
    claim = claim_from_record((predicate.get("claim") or {}).get("release"))
    rows = frame[(frame.check == RELEASE_CLAIM) & (frame.role == Role.CLAUSE)]
    if claim is None:
        require(rows.empty, f"{len(rows)} clause rows, but the statement signs no release claim")
        return "no release claim (the generic claim)"
    require(
        [c.text for c in claim.clauses] == list(rows.item),
        f"the clause rows {list(rows.item)} are not the signed clauses {[c.text for c in claim.clauses]}",
    )
    expected = to_frame(clause_rows(frame[frame.check != RELEASE_CLAIM], claim, _fits_figures(rows)))
    for (_, got), (_, want), clause in zip(rows.iterrows(), expected.iterrows(), claim.clauses):
        for column in ("metric", "comparator", "threshold_value", "value", "status"):
            require(
                _same(got[column], want[column]),
                f"clause {clause.text!r}: results.json says {column} {got[column]!r}, "
                f"the signed numbers give {want[column]!r}",
            )
    stated = to_frame(sentence_rows(claim))
    left = frame[(frame.check == RELEASE_CLAIM) & (frame.role == Role.SENTENCE)]
    require(
        not_judged(left) == not_judged(stated) and len(left) == len(stated),
        f"results.json says the sentence leaves {not_judged(left) or 'nothing'} unjudged, the signed claim "
        f"{list(claim.unjudged) or 'nothing'}",
    )
    met = int((rows.status == "PASS").sum())
    return f"{len(rows)} clauses of the signed claim re-derived from the signed rows and re-judged; {met} met"


def check_verdict_file(folder: Path, predicate: dict, frame: pd.DataFrame) -> Check | None:
    """verdict.json names the envelope on disk and agrees with the signed run (None: the folder has none)."""
    path = Path(folder) / VERDICT_NAME
    if not path.is_file():
        return None
    problems = verdict_problems(
        path.read_bytes(), (Path(folder) / "statement.dsse.json").read_bytes(), predicate["verdict"], frame
    )
    if problems:
        return Check(FAIL, VERDICT_NAME, "; ".join(problems))
    return Check(
        PASS,
        VERDICT_NAME,
        "not a subject (written after signing); names the statement's sha256 and agrees "
        "with its verdict and clause results",
    )
