"""Each clause of the release claim as one judged row of the ``release claim`` section.

A clause row reads the rows the checks measured (by check and role, never by prose) and
carries the clause's bound as ``threshold_value`` and its comparator, so :func:`reportgen.results.judge`
decides met (PASS) or not met (FAIL), and ``reportgen.verify`` re-judges it from the signed
numbers and re-derives it from the signed frame (:func:`clause_rows` is a function of the frame
and the signed ``fits`` figures only). A clause whose measurement is missing (its check did not
run or raised) is a NOT_RUN row: *cannot tell*, which fails the claim like any required NOT_RUN.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from reportgen.claim.clauses import FITS, QUANTITY, TASK, UNCHANGED, Claim, Clause
from reportgen.config import (
    DIST_GRADIENT_PARITY,
    DIST_STEP_PARITY,
    DIST_TASK_METRICS,
    DIST_TRAJECTORY,
    GRADIENT_PARITY,
    MEMORY,
    RELEASE_CLAIM,
    STATE_PARITY,
    STEP_PARITY,
    TASK_METRICS,
    TIME,
    TRAJECTORY,
)
from reportgen.results import Role, Row, Status, check_status
from reportgen.results.row import to_float

#: The checks behind ``training unchanged``; the sharded ones count when the run has their rows.
PARITY_CHECKS = (GRADIENT_PARITY, STEP_PARITY, TRAJECTORY, STATE_PARITY)
SHARDED_PARITY_CHECKS = (DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY)
#: Where each quantity is measured: (check, role, variant, column holding the judged number).
SOURCES = {
    "peak_saving_share": (MEMORY, Role.PEAK_SAVING, "recompute", "value"),
    "overhead_ratio_ci_high": (TIME, Role.OVERHEAD, "recompute", "ci_high"),
    "step_time_ms": (TIME, Role.MEDIAN, "recompute", "value"),
}
#: What to do when a clause is not met (or cannot be told), per kind of clause and quantity.
FIXES = {
    UNCHANGED: "see the diagnosis of each parity check named (its section in the report); a claim with "
    "training changed cannot ship",
    TASK: "see the task-metrics section: a metric that drifts with parity passing points at the data order or "
    "RNG; or state a tolerance the release can promise (budget.metric_tolerance)",
    "peak_saving_share": "recompute more or larger regions (recompute.targets), or state the saving measured",
    "overhead_ratio_ci_high": "recompute fewer regions or keep cheap ops (recompute=selective); when the median is "
    "within but the CI is not, measure more steps (timing.max_measure_seconds)",
    "step_time_ms": "recompute fewer regions or keep cheap ops (recompute=selective), or state the time measured",
    FITS: "recompute more of the model, lower the precision (dtype / precision.autocast), or claim a smaller batch",
}
#: What page 1 says for a clause row's status.
OUTCOMES: dict[str, str] = {Status.PASS: "met", Status.FAIL: "not met"}


def outcome(status: str) -> str:
    """``met`` (PASS), ``not met`` (FAIL) or ``cannot tell`` (anything else: not measured, raised)."""
    return OUTCOMES.get(status, "cannot tell")


def clause_rows(frame: pd.DataFrame, claim: Claim, fits: dict[str, dict[str, Any]] | None = None) -> list[Row]:
    """One row per clause of ``claim`` (:func:`reportgen.claim.clauses.parse_claim`), judged from the checks' rows
    in ``frame`` (clause rows already in it are ignored): rows of check ``release claim``, role ``claim_clause``, in
    clause order. ``fits`` is ``{clause text: figures}`` from :func:`reportgen.claim.fits.measure_fits`
    (``predicted_bytes`` and how it was obtained, or ``error``)."""
    frame = frame[frame.check != RELEASE_CLAIM]
    fits = fits or {}
    build = {
        UNCHANGED: _unchanged,
        QUANTITY: _quantity,
        TASK: _task,
        FITS: lambda f, c: _fits(c, fits.get(c.text, {"error": "not estimated"})),
    }
    return [build[clause.kind](frame, clause) for clause in claim.clauses]


#: The item of the row that states the sentence is not judged.
SENTENCE_ITEM = "the claim sentence"


def sentence_rows(claim: Claim | None) -> list[Row]:
    """One WARN row (role ``claim_sentence``) when the sentence states quantities no clause judges
    (``claim.unjudged_ok=true``): the verdict covers the clauses only, and every output reads this row to
    say the sentence is not judged. ``value``: how many quantities; ``quantities``: them, ``"; "``-joined."""
    if claim is None or not claim.unjudged:
        return []
    said = "; ".join(claim.unjudged)
    detail = (
        f"not judged: the sentence states {said}, which no clause judges (claim.unjudged_ok=true); the verdict "
        "covers the clauses only"
    )
    extra = {"quantities": said, "clause_fix": "add the clause each quantity names, or reword the sentence"}
    row = Row.fact(RELEASE_CLAIM, SENTENCE_ITEM, Role.SENTENCE, detail, status=Status.WARN, extra=extra)
    row.metric, row.value, row.unit = "sentence_quantities_not_judged", float(len(claim.unjudged)), "quantities"
    return [row]


def not_judged(frame: pd.DataFrame) -> list[str]:
    """The quantities of the claim sentence no clause judges, from ``frame``'s ``claim_sentence`` row
    (empty: every quantity of the sentence is judged, or the run has no claim sentence)."""
    rows = frame[frame.role == Role.SENTENCE] if "role" in frame.columns else frame.iloc[0:0]
    if rows.empty or "quantities" not in rows.columns:
        return []
    return [q for q in str(rows.quantities.iloc[0]).split("; ") if q]


def _row(clause: Clause, value: float, detail: str, **extra: Any) -> Row:
    """A judged clause row: ``value <comparator> bound``, FAIL when missed."""
    extra = {"clause_kind": clause.kind, "clause_fix": clause_fix(clause), **extra}
    judged: dict[str, Any] = {"comparator": clause.comparator, "threshold_value": clause.bound, "role": Role.CLAUSE}
    judged |= {"threshold": bound_text(clause), "detail": detail, "extra": extra}
    return Row.measured(RELEASE_CLAIM, clause.text, clause.metric, float(value), clause.unit, **judged)


def clause_fix(clause: Clause) -> str:
    """What to change when ``clause`` is not met (:data:`FIXES`)."""
    return FIXES.get(clause.metric, FIXES.get(clause.kind, ""))


def cannot_tell(clause: Clause, why: str, **extra: Any) -> Row:
    """A clause whose measurement is missing: NOT_RUN, no comparison (page 1: *cannot tell*)."""
    fix = "run the check the clause reads to the end (its row in the report says why it did not)"
    row = _row(clause, math.nan, f"cannot tell: {why}", clause_fix=fix, **extra)
    row.comparator, row.status = "", Status.NOT_RUN  # the bound stays for people; nothing is compared
    return row


def bound_text(clause: Clause) -> str:
    """The bound for people: ``>= 0.4``, ``<= 80 GiB``, ``0 not passing``."""
    if clause.kind == FITS:
        return f"<= {clause.bound / 2**30:g} GiB"
    if clause.kind in (UNCHANGED, TASK):
        return "none outside"
    return f"{clause.comparator} {clause.bound:g}{' ms' if clause.unit == 'ms' else ''}"


def _unchanged(frame: pd.DataFrame, clause: Clause) -> Row:
    """``training unchanged``: how many parity checks do not pass (FAIL or INCONCLUSIVE); cannot
    tell when none fails but one raised or did not run."""
    checks = list(PARITY_CHECKS) + [c for c in SHARDED_PARITY_CHECKS if (frame.check == c).any()]
    status = {c: check_status(frame.loc[frame.check == c, "status"]) for c in checks}
    failing = [c for c, s in status.items() if s in (Status.FAIL, Status.INCONCLUSIVE)]
    unknown = [c for c, s in status.items() if s in (Status.ERROR, Status.NOT_RUN)]
    if not failing and unknown:
        return cannot_tell(clause, f"{', '.join(unknown)} did not run to the end (ERROR or NOT_RUN)")
    detail = (
        f"{len(checks)} parity checks pass: {', '.join(checks)}"
        if not failing
        else f"not passing: {', '.join(failing)}" + (f"; did not finish: {', '.join(unknown)}" if unknown else "")
    )
    return _row(clause, len(failing), detail, source=", ".join(checks))


def _quantity(frame: pd.DataFrame, clause: Clause) -> Row:
    """A bounded quantity read from its check's row (the overhead's upper 95% CI end)."""
    check, role, variant, column = SOURCES[clause.metric]
    hit = frame[(frame.check == check) & (frame.role == role) & (frame.variant == variant)]
    source = f"{check}, {hit.item.iloc[0] if len(hit) else role}"
    if hit.empty or column not in hit.columns or not _finite(hit[column].iloc[0]):
        return cannot_tell(clause, f"{check} has no measured {clause.metric} (did the check run?)", source=source)
    row = hit.iloc[0]
    extra = {"source": source, "measured_value": float(row.value)}
    if clause.metric == "overhead_ratio_ci_high":
        low = float(row.get("ci_low", math.nan))
        extra |= {"ci_low": low, "ci_high": float(row[column])}
        detail = (
            f"overhead {row.value:.3f} (95% CI {low:.3f}–{row[column]:.3f}); judged on the CI's upper end, "
            "so step-time noise cannot pass the clause"
        )
        if row.value <= clause.bound < row[column]:
            detail += (
                f": the median is within {clause.bound:g} but the CI reaches past it, so this cannot tell; "
                "measure more steps"
            )
    elif clause.metric == "step_time_ms":
        extra |= {"ci_low": float(row.get("p25_ms", math.nan)), "ci_high": float(row.get("p75_ms", math.nan))}
        detail = (
            f"median recompute step {row.value:.3g} ms (interquartile {extra['ci_low']:.3g}–{extra['ci_high']:.3g} ms)"
        )
    else:
        detail = (
            f"recompute lowers the warm step's peak of live tensor bytes by {row.value:.1%} of the plain peak"
            f" ({_bytes(row.get('plain_peak_bytes'))} → {_bytes(row.get('recompute_peak_bytes'))})"
        )
    return _row(clause, float(row[column]), detail, **extra)


def _task(frame: pd.DataFrame, clause: Clause) -> Row:
    """``task metric within tolerance``: seeds whose held-out metric difference does not pass."""
    checks = [TASK_METRICS] + ([DIST_TASK_METRICS] if (frame.check == DIST_TASK_METRICS).any() else [])
    diffs = frame[frame.check.isin(checks) & (frame.role == Role.METRIC_DIFF)]
    broken = frame[frame.check.isin(checks) & frame.status.isin([Status.ERROR, Status.NOT_RUN])]
    if diffs.empty or (not (diffs.status == Status.FAIL).any() and len(broken)):
        why = f"{' and '.join(checks)} measured no metric difference for every seed (disabled, raised or interrupted)"
        return cannot_tell(clause, why, source=", ".join(checks))
    share = pd.to_numeric(diffs.value, errors="coerce") / pd.to_numeric(diffs.threshold_value, errors="coerce")
    outside = int((diffs.status != Status.PASS).sum())
    detail = (
        f"{outside} of {len(diffs)} seed runs outside budget.metric_tolerance; the largest difference uses "
        f"{share.max():.1%} of its tolerance"
    )
    return _row(clause, outside, detail, source=", ".join(checks), measured_value=float(share.max()))


def _fits(clause: Clause, figures: dict[str, Any]) -> Row:
    """``fits: batch B [at seq S] within M GiB``: the predicted recompute step peak at that shape."""
    if "predicted_bytes" not in figures or not _finite(figures["predicted_bytes"]):
        return cannot_tell(clause, figures.get("error", "no prediction"))
    extra = {k: v for k, v in figures.items() if k != "method"}
    peak, method = figures["predicted_bytes"], figures["method"]
    detail = f"predicted step peak {_bytes(peak)} of {_bytes(clause.bound)}: {method}"
    return _row(clause, peak, detail, fits_method=method, **extra)


def _finite(value: Any) -> bool:
    return math.isfinite(to_float(value))


def _bytes(value: Any) -> str:
    """Bytes in GiB/MiB for a sentence ("—" when missing)."""
    if not _finite(value):
        return "—"
    value = float(value)
    return f"{value / 2**30:.2f} GiB" if abs(value) >= 2**30 else f"{value / 2**20:.2f} MiB"


def claim_table(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Page 1's claim table and the CI outputs' rows: one dict per clause row of ``frame``:
    ``{"clause", "value", "low", "high", "measured", "bound", "unit", "status", "outcome", "detail", "kind", "fix"}``;
    ``measured`` is the value for people, with its interval (``1.12 (95% CI 1.05–1.19)``)."""
    rows = frame[(frame.check == RELEASE_CLAIM) & (frame.role == Role.CLAUSE)]
    finite = lambda value: value if _finite(value) else None
    out = []
    for r in rows.to_dict("records"):
        measured = r.get("measured_value")
        shown = r["value"] if r.get("clause_kind") != QUANTITY or not _finite(measured) else measured
        row = {"clause": r["item"], "value": finite(shown), "low": finite(r.get("ci_low"))}
        row |= {"high": finite(r.get("ci_high")), "bound": r["threshold"], "unit": r.get("unit") or ""}
        row |= {"status": r["status"], "outcome": outcome(r["status"]), "detail": r["detail"]}
        row |= {"kind": r.get("clause_kind"), "fix": r.get("clause_fix") or ""}
        out.append(row | {"measured": measured_text(row)})
    return out


def measured_text(c: dict[str, Any]) -> str:
    """A clause's measured value with its unit and interval, for page 1 and the CI summary."""
    value, low, high = c["value"], c["low"], c["high"]
    if value is None:
        return "not measured"
    if c["unit"] == "B":
        return _bytes(value)
    if c["unit"] in ("checks", "seeds"):
        return f"{int(value)} not passing"
    text = f"{value:.1%}" if c["unit"] == "share" else f"{value:.3g}{' ms' if c['unit'] == 'ms' else ''}"
    if low is not None and high is not None:
        text += (
            f" (95% CI {low:.3g}–{high:.3g})" if c["unit"] == "ratio" else f" (interquartile {low:.3g}–{high:.3g} ms)"
        )
    return text
