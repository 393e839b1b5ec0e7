"""Page 1's evidence, read from the results frame: per failing required check, its worst item, the measured
difference and how many items fail; per check whose plain twin broke, what broke."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from reportgen.results import BASELINE, TWIN, Role, Status, baseline_rows, judged_status
from reportgen.results.row import to_float

#: At most this many failing checks are led on page 1 (every one is in the checks table below it).
MOST_CHECKS = 6


def no_nan(value: Any) -> Any:
    """``value``, or None for a float NaN (a missing value in a frame)."""
    return None if isinstance(value, float) and math.isnan(value) else value


def tolerance_share(record: dict) -> float:
    """How many times its tolerance a compared item uses: ``tolerance_used`` (the worst element's
    ``|recompute − plain| ÷ (atol + rtol·|plain|)``) where the row has it, else ``value ÷ threshold``
    of a ``<=``/``<`` row (a metric difference, a final-parameters share), else inf for a missed
    exact comparison (``excess > 0``) and NaN when nothing says (an exception, a count).

    Returns:
        The share (1 = exactly the tolerance), ratio.
    """
    used = to_float(record.get("tolerance_used"))
    if not math.isnan(used):
        return used
    if record.get("metric") == "final_params_tolerance_used":
        return to_float(record.get("value"))
    threshold, value = to_float(record.get("threshold_value")), to_float(record.get("value"))
    if record.get("comparator") in ("<=", "<") and threshold > 0 and not math.isnan(value):
        return value / threshold
    return math.inf if to_float(record.get("excess")) > 0 else math.nan


def measured_difference(record: dict) -> float:
    """``max |recompute − plain|`` of the row's item (its value for ``max_abs_err`` and ``abs_diff_*``
    rows, the worst parameter's for a final-parameters row), NaN when the row measures none or one
    that means nothing (an integer tensor such as a generator state: its detail counts the entries
    that differ)."""
    if record.get("values_differing") is not None:
        return math.nan
    metric = str(record.get("metric") or "")
    if metric == "max_abs_err" or metric.startswith("abs_diff"):
        return to_float(record.get("value"))
    return to_float(record.get("max_abs_err"))


def worst_row(group: pd.DataFrame) -> dict | None:
    """The FAIL row of one check with the largest share of its tolerance; without FAIL rows its first
    ERROR or NOT_RUN row; None when nothing in it fails."""
    records = [_clean(r) for r in group.to_dict("records")]
    failed = [r for r in records if r["status"] == Status.FAIL]
    if failed:
        return max(failed, key=lambda r: -1.0 if math.isnan(share := tolerance_share(r)) else share)
    return next((r for r in records if r["status"] in (Status.ERROR, Status.NOT_RUN, Status.INCONCLUSIVE)), None)


def _clean(record: dict) -> dict:
    return {k: no_nan(v) for k, v in record.items()}


def check_evidence(check: str, group: pd.DataFrame, diagnosis: dict | None) -> dict | None:
    """One failing check's lead (its worst row, :func:`worst_row`), None when nothing in it fails.

    ``baseline`` is True when the plain twin broke (the check cannot be judged); then ``item`` and
    ``detail`` are those of the plain twin's first broken row. ``failing`` counts the check's FAIL
    rows, ``judged`` its rows with a comparator.
    """
    status = judged_status(group)
    broken = baseline_rows(group)
    lead = _clean(broken.iloc[0].to_dict()) if status == Status.INCONCLUSIVE and len(broken) else worst_row(group)
    if lead is None:
        return None
    failing, judged = int((group.status == Status.FAIL).sum()), int(group.comparator.fillna("").astype(bool).sum())
    if lead.get("items_outside") is not None and lead.get("items"):  # an aggregate row (a trajectory step): its items
        failing, judged = int(lead["items_outside"]), int(lead["items"])
    item = str(lead["item"]) + (f": {lead['worst_item']}" if lead.get("worst_item") else "")
    plain, recompute = scalar_values(lead)
    entry = {"check": check, "status": status, "item": item, "status_row": lead["status"], "plain": plain}
    entry |= {"share": tolerance_share(lead), "difference": measured_difference(lead), "recompute": recompute}
    entry |= {"tolerance": lead.get("threshold"), "detail": lead.get("detail") or ""}
    entry["differing"] = lead.get("values_differing")  # an integer tensor (a generator state): entries that differ
    entry |= {"failing": failing, "judged": judged, "same_as": None}
    entry["baseline"] = lead.get(TWIN) == BASELINE and status == Status.INCONCLUSIVE
    return entry | {k: None if diagnosis is None else diagnosis.get(k) for k in ("cause", "fix")}


def scalar_values(record: dict) -> tuple[str | None, str | None]:
    """Both twins' values of a row that compares two numbers (a loss, a metric), with enough digits
    that different values read differently; ``(None, None)`` for tensors (their L2 norms prove
    nothing: the measured difference is what counts)."""
    a, b = record.get("plain_value"), record.get("recompute_value")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
        return None, None
    if a == b:
        return f"{a:.6g}", f"{b:.6g}"
    for digits in range(3, 18):
        left, right = f"{a:.{digits}g}", f"{b:.{digits}g}"
        if left != right:
            return left, right
    return repr(a), repr(b)


def lead_evidence(frame: pd.DataFrame, required: list[str], most: int = MOST_CHECKS) -> list[dict]:
    """Page 1's lead, one entry per required check that fails or cannot be judged, and per check with an
    INCONCLUSIVE row (a detector control that was not caught), required or not (at most ``most``):
    failing checks in the checklist's order, then those whose plain twin broke (:func:`check_evidence`
    per check). An entry whose diagnosis (cause and fix) an earlier entry already gave has
    ``same_as`` = that entry's check."""
    diagnosis = {r["check"]: r for r in frame[frame.role == Role.DIAGNOSIS].to_dict("records")}
    out = []
    gates = frame.check[frame.status == Status.INCONCLUSIVE].unique()  # decides the claim, required or not
    # diagnosis and clause rows are no check's evidence (the claim's table names clauses)
    judged = frame.check.isin([*required, *gates]) & ~frame.role.isin([Role.DIAGNOSIS, Role.CLAUSE])
    for check, group in frame[judged].groupby("check", sort=False):
        if judged_status(group) not in (Status.FAIL, Status.ERROR, Status.NOT_RUN, Status.INCONCLUSIVE):
            continue
        if (group.status == Status.NOT_RUN).all():  # disabled or interrupted: the checks table says so
            continue
        entry = check_evidence(check, group, diagnosis.get(check))
        if entry is not None:
            out.append(entry)
    out.sort(key=lambda e: e["baseline"])  # failures first; checks without a baseline after (or alone)
    first: dict[str, str] = {}
    for entry in out:  # one cause and fix said once: later checks they explain point back to the first
        if entry["cause"] is not None:
            said = f"{entry['cause']}\n{entry['fix']}"  # one rule reads its cause and fix from each check's evidence
            entry["same_as"] = first.get(said)
            first.setdefault(said, entry["check"])
    return out[:most]


def baseline_breaks(frame: pd.DataFrame) -> list[dict]:
    """What in the plain twin broke, per check: ``[{"check", "item", "detail"}]`` (first broken row each)."""
    broken = [(check, baseline_rows(group)) for check, group in frame.groupby("check", sort=False)]
    return [{"check": c, "item": b.iloc[0]["item"], "detail": b.iloc[0]["detail"]} for c, b in broken if len(b)]
