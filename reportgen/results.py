"""Result rows, the tidy results frame, and the claim verdict.

The frame is the single source of truth: results.csv / results.json are written from it
before anything is rendered, and the templates read nothing else but run metadata.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from .rundir import output_file_mode

PASS, WARN, FAIL, ERROR, NOT_RUN, INFO, FLAGGED = "PASS", "WARN", "FAIL", "ERROR", "NOT_RUN", "INFO", "FLAGGED"
#: Worst first: the status of a check is the first of these that any of its rows has. A
#: measured FAIL outranks an ERROR: it is a definite answer, an ERROR only says "unknown".
SEVERITY = [FAIL, ERROR, NOT_RUN, WARN, PASS, FLAGGED, INFO]
COLUMNS = ["check", "item", "variant", "metric", "value", "threshold", "comparator", "status", "detail", "seconds"]


@dataclass
class Row:
    """One measured fact (DESIGN.md row contract).

    Attributes:
        check: checklist item, e.g. ``"gradient parity"``.
        item: what was measured, e.g. a tensor name ``"blocks.0.lin.weight.grad"``.
        variant: ``"plain"``, ``"recompute"`` (compared with plain) or ``"larger_batch"``.
        metric: name with its unit, e.g. ``max_abs_err``, ``saved_activation_bytes``.
        value: the measurement (float; NaN when there is none).
        threshold: the tolerance or threshold it is judged against, as text ("" if none).
        comparator: how value meets threshold, e.g. ``"allclose"``, ``"<="``, ``"=="``.
        status: one of PASS/WARN/FAIL/ERROR/NOT_RUN/INFO/FLAGGED.
        detail: one human sentence; an ERROR row carries the exception message.
        seconds: wall time the measurement took, s.
        extra: further named columns (e.g. ``max_rel_err``, ``bitwise_equal``).
    """

    check: str
    item: str
    variant: str
    metric: str
    value: float = math.nan
    threshold: str = ""
    comparator: str = ""
    status: str = INFO
    detail: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def to_frame(rows: Iterable[Row]) -> pd.DataFrame:
    """Rows → one tidy DataFrame, fixed columns first, ``extra`` keys as further columns."""
    records = []
    for row in rows:
        record = asdict(row)
        record.update(record.pop("extra"))
        records.append(record)
    frame = pd.DataFrame.from_records(records)
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    extras = [c for c in frame.columns if c not in COLUMNS]
    return frame[COLUMNS + extras]


def check_status(statuses: Iterable[str]) -> str:
    """Status of a check from the statuses of its rows: the most severe one (SEVERITY order)."""
    present = set(statuses)
    return next((s for s in SEVERITY if s in present), NOT_RUN)


def check_summary(frame: pd.DataFrame, required: Iterable[str]) -> pd.DataFrame:
    """One row per check: ``check, status, required, rows, failing`` in first-seen order."""
    required = set(required)
    out = []
    for check, group in frame.groupby("check", sort=False):
        bad = group[group.status.isin([FAIL, ERROR, NOT_RUN])]
        out.append({"check": check, "status": check_status(group.status), "required": check in required,
                    "rows": len(group), "failing": len(bad)})
    for check in required - set(frame.check):
        out.append({"check": check, "status": NOT_RUN, "required": True, "rows": 0, "failing": 0})
    return pd.DataFrame(out, columns=["check", "status", "required", "rows", "failing"])


def claim_verdict(frame: pd.DataFrame, required: Iterable[str]) -> str:
    """PASS only when every required check passes (DESIGN.md "Claim verdict").

    A required check fails the claim when it has any FAIL, ERROR or NOT_RUN row, or no rows
    at all. WARN and INFO rows do not fail it; FLAGGED rows never count, whatever the check.
    """
    summary = check_summary(frame[frame.status != FLAGGED], required)
    bad = summary[summary.required & summary.status.isin([FAIL, ERROR, NOT_RUN])]
    return FAIL if len(bad) else PASS


def atomic_write(path: Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace`` (no torn files).

    Raises:
        FileExistsError: ``path`` exists already; outputs never overwrite an earlier run.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists already; reportgen never overwrites an earlier run")
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, output_file_mode())  # mkstemp makes 0600; outputs follow the umask (rundir)
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_write(path: Path, data: bytes | str) -> Path:
    """Atomically (re)write a file this run owns, e.g. the partial frame after each check."""
    Path(path).unlink(missing_ok=True)
    return atomic_write(path, data)


def frame_to_json(frame: pd.DataFrame) -> str:
    """The frame as JSON records (NaN → null), stable key order; the attached results.json."""
    records = json.loads(frame.to_json(orient="records", double_precision=15))
    return json.dumps(records, indent=1, sort_keys=False) + "\n"


def frame_from_json(text: str) -> pd.DataFrame:
    """Inverse of :func:`frame_to_json` (used by ``reportgen.verify``)."""
    frame = pd.DataFrame.from_records(json.loads(text))
    return frame if not frame.empty else pd.DataFrame(columns=COLUMNS)
