"""The tidy results frame (the single source of truth), each check's status, the claim verdict, and
the lossless results.json."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from reportgen.config import (
    CONTROLS,
    DIST_GRADIENT_PARITY,
    DIST_MEMORY,
    DIST_STEP_PARITY,
    DIST_TASK_METRICS,
    DIST_TIME,
    DIST_TRAJECTORY,
)
from reportgen.results.role import Role
from reportgen.results.row import BASELINE, COLUMNS, SEVERITY, TWIN, Row, Status

#: The version of the results.csv/json schema (docs/results-schema.md) this reportgen writes. 1: the
#: files before the ``schema_version`` column existed (same core columns); 2: with it.
SCHEMA_VERSION = 2
#: The versions this reportgen reads (``frame_from_json``); anything else is refused.
READABLE_SCHEMA_VERSIONS = (1, 2)
#: The sharded checks: a baseline of theirs that cannot be judged leaves the single-process evidence standing.
SHARDED_CHECKS = (DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY, DIST_MEMORY, DIST_TIME, DIST_TASK_METRICS)


class SchemaVersionError(ValueError):
    """results.json was written by a reportgen whose schema this one cannot read."""


def to_frame(rows: Iterable[Row]) -> pd.DataFrame:
    """Rows → one tidy DataFrame, fixed columns first, ``extra`` keys as further columns."""
    frame = pd.DataFrame.from_records([row.record() for row in rows])
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    frame["schema_version"] = SCHEMA_VERSION
    return frame[COLUMNS + [c for c in frame.columns if c not in COLUMNS]]


def check_status(statuses: Iterable[str]) -> str:
    """Status of a check from the statuses of its rows: the most severe one (SEVERITY order)."""
    present = set(statuses)
    return next((s for s in SEVERITY if s in present), Status.NOT_RUN)


def baseline_rows(group: pd.DataFrame) -> pd.DataFrame:
    """The ERROR and NOT_RUN rows of ``group`` that the baseline caused (column ``twin`` == :data:`BASELINE`)."""
    if TWIN not in group.columns:
        return group.iloc[0:0]
    return group[group.status.isin([Status.ERROR, Status.NOT_RUN]) & (group[TWIN] == BASELINE)]


def judged_status(group: pd.DataFrame) -> str:
    """Status of one check from its rows: the most severe (:func:`check_status`), except that a check
    whose plain twin broke (:func:`baseline_rows`) and that measured no FAIL cannot be judged:
    INCONCLUSIVE, whatever the recompute twin did there (it ran without a working baseline)."""
    status = check_status(group.status)
    if status in (Status.ERROR, Status.NOT_RUN) and len(baseline_rows(group)):
        return Status.INCONCLUSIVE
    return status


def check_summary(frame: pd.DataFrame, required: Iterable[str]) -> pd.DataFrame:
    """One row per check: ``check, status, required, rows, failing`` in first-seen order (``status`` by
    :func:`judged_status`)."""
    required = set(required)
    failing = [Status.FAIL, Status.ERROR, Status.NOT_RUN]
    out = [
        (check, judged_status(group), check in required, len(group), int(group.status.isin(failing).sum()))
        for check, group in frame.groupby("check", sort=False)
    ]
    out += [(check, Status.NOT_RUN, True, 0, 0) for check in required - set(frame.check)]
    return pd.DataFrame(out, columns=["check", "status", "required", "rows", "failing"])


def detectors(frame: pd.DataFrame) -> str:
    """What every output states beside the verdict about the detector controls (docs/verdict.md): "" when they
    ran, else one sentence beginning "detectors not proven" (``controls.enabled=false``, or a frame without them):
    no fault was injected, so no PASS in it shows its check could have seen one."""
    rows = frame[frame.check == CONTROLS]
    if len(rows) and not (rows.status == Status.NOT_RUN).all():
        return ""
    why = str(rows.detail.iloc[0]).removeprefix("not run: ") if len(rows) else "the run has no detector controls"
    return f"detectors not proven: {why}, so no fault was injected and no PASS here shows its check could see one"


def claim_verdict(frame: pd.DataFrame, required: Iterable[str]) -> str:
    """PASS only when every required check passes (docs/architecture.md, "Verdict and exit codes").

    INCONCLUSIVE when any row says the claim cannot be judged (e.g. the plain twin is not
    reproducible against itself); it outranks everything else, but for a detector control's row
    (:attr:`Role.CONTROL`), which only stands between the claim and PASS: a required check that fails on
    its own evidence fails the claim whatever a control says (the control's row stays beside it). An INCONCLUSIVE
    row of a sharded check (:data:`SHARDED_CHECKS`: a distributed baseline that drifted or raised) stands the same
    way before the single-process checks: a fault they prove (FAIL, ERROR) fails the claim, and the sharded checks' own
    failures no longer count (their baseline cannot be trusted), nor a check left NOT_RUN (nothing proven); the
    sharded check stays INCONCLUSIVE beside it. Otherwise a
    required check
    fails the claim when it has any FAIL, ERROR or NOT_RUN row of the recompute twin, or no rows
    at all. A required check whose plain twin broke (:func:`judged_status`: INCONCLUSIVE) makes
    the claim INCONCLUSIVE unless another required check fails it: the recompute twin raising
    where the plain twin does not is still a failure. WARN and INFO rows do not fail it;
    FLAGGED rows never count, whatever the check.
    """
    inconclusive = frame.status == Status.INCONCLUSIVE
    control = frame.role == Role.CONTROL
    sharded = frame.check.isin(SHARDED_CHECKS)
    if (inconclusive & ~control & ~sharded).any():
        return Status.INCONCLUSIVE
    summary = check_summary(frame[frame.status != Status.FLAGGED], required)
    summary = summary[summary.required]
    failing = summary.status.isin([Status.FAIL, Status.ERROR, Status.NOT_RUN])
    if (inconclusive & sharded).any():  # a distributed baseline that cannot be judged: a fault proven on one process
        failing = summary.status.isin([Status.FAIL, Status.ERROR]) & ~summary.check.isin(SHARDED_CHECKS)
    if failing.any():
        return Status.FAIL
    if (inconclusive & (control | sharded)).any() or (summary.status == Status.INCONCLUSIVE).any():
        return Status.INCONCLUSIVE
    return Status.PASS


def plain_value(value: Any) -> Any:
    """numpy scalars → Python; NaN/None → None (dropped from a results.json record; null in the statement,
    which is strict JSON)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def results_csv(frame: pd.DataFrame) -> str:
    """results.csv's text from ``frame`` as :func:`frame_from_json` reads results.json: the CSV of exactly
    results.json's rows (a column with no value in any row is in neither). The run writes it,
    ``reportgen.sign`` and ``reportgen.verify`` re-derive it byte for byte."""
    return frame.to_csv(index=False)


def frame_to_json(frame: pd.DataFrame) -> str:
    """The frame as compact, lossless JSON records: the attached, signed results.json.

    One record per line; keys in column order; a record leaves out its empty (NaN/None)
    columns, which :func:`frame_from_json` restores as NaN. Floats are written with Python's
    shortest round-trip repr (exact for float64); +-inf as ``Infinity`` (Python's json).
    """
    columns = list(frame.columns)
    lines = []
    for values in frame.itertuples(index=False, name=None):
        record = {c: v for c, v in ((c, plain_value(v)) for c, v in zip(columns, values)) if v is not None}
        lines.append(json.dumps(record, separators=(",", ":")))
    return "[\n" + ",\n".join(lines) + "\n]\n"


def frame_from_json(text: str) -> pd.DataFrame:
    """Inverse of :func:`frame_to_json` (used by ``reportgen.verify``); fixed columns first.

    Raises:
        SchemaVersionError: a record's ``schema_version`` is not one of
            :data:`READABLE_SCHEMA_VERSIONS` (a file from a newer reportgen, or an edited one).
    """
    frame = pd.DataFrame.from_records(json.loads(text))
    versions = set(frame["schema_version"].dropna()) if "schema_version" in frame.columns else set()
    unknown = sorted(str(v) for v in versions if v not in READABLE_SCHEMA_VERSIONS)
    if unknown:
        raise SchemaVersionError(
            f"results.json has schema version {', '.join(unknown)}; this reportgen reads versions "
            f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))} (docs/results-schema.md): verify it with the "
            "reportgen that wrote it, or a newer one"
        )
    frame["schema_version"] = frame["schema_version"].fillna(1) if "schema_version" in frame.columns else 1
    for column in COLUMNS:
        if column not in frame.columns:
            frame[column] = math.nan
    return frame[COLUMNS + [c for c in frame.columns if c not in COLUMNS]]
