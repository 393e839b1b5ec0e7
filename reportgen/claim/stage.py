"""The pipeline's two claim hooks: judge the clauses after the checks, and name the unmet ones on the console."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from reportgen.claim.clauses import Claim
from reportgen.claim.fits import measure_fits
from reportgen.claim.rows import claim_table, clause_rows, sentence_rows
from reportgen.config import RELEASE_CLAIM
from reportgen.results import Row
from reportgen.results.raised import error_row


def judge_claim(setup: Any, claim: Claim | None, frame: pd.DataFrame) -> list[Row]:
    """The ``release claim`` rows of ``claim`` from the checks' ``frame`` (none without a claim);
    ``fits`` clauses first get their predicted step peak (:func:`reportgen.claim.fits.measure_fits`); a sentence
    that states what no clause judges adds its ``claim_sentence`` row (:func:`reportgen.claim.rows.sentence_rows`)."""
    if claim is None:
        return []
    try:
        return clause_rows(frame, claim, measure_fits(setup, claim, frame)) + sentence_rows(claim)
    except Exception as exc:  # noqa: BLE001 - a crash while judging is an ERROR row, and the claim fails
        return [error_row(RELEASE_CLAIM, exc, "judging the clauses", 0.0)]


def console_lines(frame: pd.DataFrame, report: Path) -> list[str]:
    """The console's lines before the verdict (the last line): one per clause not met (or that cannot be
    told), then how to open the report."""
    lines = [
        f"reportgen: clause {c['outcome'].upper()}: {c['clause']} — measured {c['measured']}, bound {c['bound']}"
        for c in claim_table(frame)
        if c["outcome"] != "met"
    ]
    return lines + [f"reportgen: open the report: python -m webbrowser -t {Path(report).resolve().as_uri()}"]
