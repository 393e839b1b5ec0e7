"""Result rows, the one judge, the tidy results frame, and the claim verdict.

The frame is the single source of truth: results.csv / results.json are written from it
before anything is rendered, and the templates read nothing else but run metadata.

Checks *measure*: a row carries a value, a numeric threshold and a comparator. Only
:func:`judge` turns those into a status (as deepchecks separates checks from conditions), so
``reportgen.verify`` can recompute every status from the signed values with the same code.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from reportgen.files import atomic_write, replace_write  # noqa: F401 - re-exported: the writers of a run's files


class Status(enum.StrEnum):
    """A row's status (the values in results.csv/json). PASS, WARN and FAIL come from
    :func:`judge` only; the others are stated as facts (docs/architecture.md "Verdict")."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    ERROR = "ERROR"
    NOT_RUN = "NOT_RUN"
    INFO = "INFO"
    FLAGGED = "FLAGGED"
    INCONCLUSIVE = "INCONCLUSIVE"


PASS, WARN, FAIL, ERROR, NOT_RUN, INFO, FLAGGED = (
    Status.PASS,
    Status.WARN,
    Status.FAIL,
    Status.ERROR,
    Status.NOT_RUN,
    Status.INFO,
    Status.FLAGGED,
)
#: INCONCLUSIVE: the claim cannot be judged (plain twin not reproducible, plain run raised,
#: non-finite plain loss, or a baseline that already recomputes). Exit code 3.
INCONCLUSIVE = Status.INCONCLUSIVE
#: Worst first: the status of a check is the first of these that any of its rows has. A
#: measured FAIL outranks an ERROR: it is a definite answer, an ERROR only says "unknown".
SEVERITY = [INCONCLUSIVE, FAIL, ERROR, NOT_RUN, WARN, PASS, FLAGGED, INFO]
#: Column ``twin`` of an ERROR or NOT_RUN row: the twin that broke. :data:`BASELINE` ("plain") means the plain
#: twin itself raised, computed non-finite values or (sharded) drifted across ranks: the check has no baseline
#: and cannot be judged (:func:`judged_status`), which is never a recompute failure. "recompute" (or no
#: column) is a failure of the recompute twin, judged as ERROR.
TWIN = "twin"
BASELINE = "plain"
COLUMNS = [
    "check",
    "item",
    "variant",
    "role",
    "metric",
    "unit",
    "value",
    "threshold",
    "threshold_value",
    "comparator",
    "on_miss",
    "status",
    "detail",
    "seconds",
    "schema_version",
]
#: The version of the results.csv/json schema (docs/results-schema.md) this reportgen writes. 1: the
#: files before the ``schema_version`` column existed (same core columns); 2: with it.
SCHEMA_VERSION = 2
#: The versions this reportgen reads (``frame_from_json``); anything else is refused.
READABLE_SCHEMA_VERSIONS = (1, 2)


class SchemaVersionError(ValueError):
    """results.json was written by a reportgen whose schema this one cannot read."""


#: Comparators :func:`judge` knows. ``allclose``: the row's ``excess`` column,
#: ``max(|a - b| - (atol + rtol |b|))``, is <= 0 (torch.testing.assert_close's rule).
#: ``ci<=``: value <= threshold, and the upper end of its confidence interval (``ci_high``)
#: too; value within but ``ci_high`` past it is WARN (not conclusive).
#: An ``allclose`` or ``<=`` row may also carry ``rounding_excess`` (the value minus a stated
#: factor times the rounding envelope: how far plain moves under tolerance-sized gradient noise,
#: reportgen/rounding.py); finite and <= 0 passes it: the difference is at rounding level.
COMPARATORS = ("<=", "<", ">=", ">", "==", "allclose", "ci<=")


class Role:
    """What a row is, for templates and plots (never look rows up by their prose ``item``)."""

    LOSS, OUTPUT, PARAM_GRAD, INPUT_GRAD = "loss", "output", "param_grad", "input_grad"
    PARAM, OPTIMIZER_STATE, BUFFER, ATTRIBUTE, RNG = "param", "optimizer_state", "buffer", "attribute", "rng"
    WARNING, EXCEPTION, DISABLED, NOTE = "warning", "exception", "disabled", "note"
    SAVE_OP = "save_op"
    SAVED_TOTAL, SAVING, SAVED_MODULE, LOST_GRADIENTS = "saved_total", "saving", "saved_module", "lost_gradients"
    STEP_PEAK, PEAK_SAVING, ESTIMATE_PEAK = "step_peak", "peak_saving", "estimate_peak"
    CUDA_PEAK, ESTIMATE_MEASURED, ESTIMATE_TARGET, PER_LAYER = (
        "cuda_peak",
        "estimate_measured",
        "estimate_target",
        "per_layer",
    )
    STEP, MEDIAN, OVERHEAD, OVERHEAD_CI, FLOPS, LOAD = "step", "median", "overhead", "overhead_ci", "flops", "load"
    BUDGET, RUN, HELD_OUT, ACCEPTED, SKIPPED, CURVE = "budget", "run", "held_out", "accepted", "skipped", "curve"
    METRIC_DIFF, SKIPPED_DIFF, MEAN, WORST = "metric_diff", "skipped_diff", "mean", "worst"
    REFERENCE, PROBE, BATCH_FOUND = "reference", "probe", "batch_found"
    AA, NONFINITE, TRAJECTORY, FIRST_DIVERGENCE = "aa", "nonfinite", "trajectory", "first_divergence"
    FINAL_PARAMS, DIAGNOSIS, BASELINE, IGNORED = "final_params", "diagnosis", "baseline", "ignored"
    #: How many regions the recompute twin was seen recomputing (0: the configured recompute never ran).
    OBSERVED = "observed"
    #: An output leaf that is not a tensor (None, a number, a cache object), or a cache tensor only one twin returned.
    OUTPUT_OTHER = "output_other"
    CACHE = "cache"  #: a plain-twin cache entry that was not trusted (reportgen.training.cache)
    RANK_LOCAL_GRADS = "rank_local_grads"  #: one rank's own gradients before reduction (sharded checks)
    #: One twin's replicated state (parameters, buffers) compared across ranks after every step (sharded checks).
    RANK_SYNC = "rank_sync"
    #: Output leaves that changed while backward ran (a recomputation wrote the forward's outputs again).
    CHANGED_IN_BACKWARD = "changed_in_backward"
    #: The ``.grad`` of a tensor kept as a module attribute that called ``retain_grad()``.
    RETAINED_GRAD = "retained_grad"
    #: One clause of the release claim (``claim=<name>``), judged from the rows it reads (reportgen/claim/).
    CLAUSE = "claim_clause"


@dataclass(kw_only=True)
class Row:
    """One measured fact (the row contract in docs/architecture.md).

    A row with a ``comparator`` is judged when it is made: ``status`` is set by :func:`judge`
    from ``value``, ``threshold_value`` and ``on_miss`` (any status passed in is replaced).
    A row without one keeps the status it states, which must be a fact (INFO, WARN, ERROR,
    NOT_RUN, FLAGGED), never PASS or FAIL.

    Attributes:
        check: checklist item, e.g. ``"gradient parity"``.
        item: what was measured, for people, e.g. ``"blocks.0.lin.weight.grad"``.
        variant: the twin measured: ``"plain"``, ``"recompute"`` (compared with plain),
            ``"aa"`` (a second, independent plain twin) or ``"larger_batch"``.
        role: what kind of row it is (a :class:`Role` constant); templates select on it.
        metric: name with its unit, e.g. ``max_abs_err``, ``saved_activation_bytes``.
        unit: unit of ``value``: ``"B"``, ``"ms"``, ``"examples"``, ``"ratio"``, ``""``.
        value: the measurement (float; NaN when there is none).
        threshold: the threshold for people, e.g. ``"atol=1e-05 rtol=1.3e-06"`` ("" if none).
        threshold_value: the threshold :func:`judge` uses (NaN for ``allclose`` and for none).
        comparator: one of :data:`COMPARATORS`, or "" (not judged).
        on_miss: status when the comparison fails: FAIL (required) or WARN (advisory).
        status: PASS/WARN/FAIL/ERROR/NOT_RUN/INFO/FLAGGED/INCONCLUSIVE.
        detail: one human sentence; an ERROR row carries the exception message.
        seconds: wall time the measurement took, s.
        extra: further named columns (e.g. ``max_rel_err``, ``excess``, ``ci_high``).
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
    role: str = ""
    unit: str = ""
    threshold_value: float = math.nan
    on_miss: str = FAIL

    def __post_init__(self) -> None:
        self.rejudge()

    def rejudge(self) -> None:
        """Set ``status`` from the numbers again (after a builder added a column ``judge`` reads,
        e.g. ``rounding_excess``); a row without a comparator keeps its stated status."""
        if self.comparator:
            self.status = judge(
                self.value,
                self.comparator,
                self.threshold_value,
                self.on_miss,
                excess=self.extra.get("excess"),
                ci_high=self.extra.get("ci_high"),
                rounding_excess=self.extra.get("rounding_excess"),
            )

    def record(self) -> dict[str, Any]:
        """The row as one flat record: fixed columns, then ``extra``'s keys."""
        record = asdict(self)
        record.update(record.pop("extra"))
        return record


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def judge(
    value: float,
    comparator: str,
    threshold_value: float,
    on_miss: str = FAIL,
    *,
    excess: float | None = None,
    ci_high: float | None = None,
    rounding_excess: float | None = None,
) -> str:
    """Turn a measurement into a status: the only place a PASS or FAIL is decided.

    Args:
        value: the measurement. NaN or a missing threshold never meets a comparison.
        comparator: one of :data:`COMPARATORS`.
        threshold_value: what ``value`` is compared with (unused by ``allclose``).
        on_miss: the status of a missed comparison (FAIL, or WARN for advisory rows).
        excess: ``allclose`` only: ``max(|a - b| - (atol + rtol |b|))``; <= 0 passes.
        ci_high: ``ci<=`` only: the upper end of the value's confidence interval.
        rounding_excess: ``allclose`` and ``<=`` only: the difference minus the allowed multiple
            of the rounding envelope (reportgen/rounding.py); finite and <= 0 passes a row that
            misses its tolerance: the difference is one rounding-level noise would also make.

    Returns:
        PASS, WARN or ``on_miss``.

    Raises:
        ValueError: an unknown comparator.
    """
    value, threshold_value = _number(value), _number(threshold_value)
    rounding = _number(rounding_excess)
    if comparator in ("allclose", "<=") and math.isfinite(rounding) and rounding <= 0:
        return PASS
    if comparator == "allclose":
        excess = _number(excess)
        return PASS if math.isfinite(excess) and excess <= 0 else on_miss
    if comparator not in COMPARATORS:
        raise ValueError(f"unknown comparator {comparator!r}; known: {', '.join(COMPARATORS)}")
    if math.isnan(value) or math.isnan(threshold_value):
        return on_miss
    if comparator == "ci<=":
        if value > threshold_value:
            return on_miss
        return WARN if _number(ci_high) > threshold_value or math.isnan(_number(ci_high)) else PASS
    met = {
        "<=": value <= threshold_value,
        "<": value < threshold_value,
        ">=": value >= threshold_value,
        ">": value > threshold_value,
        "==": value == threshold_value,
    }[comparator]
    return PASS if met else on_miss


def judge_record(record: Mapping[str, Any]) -> str:
    """:func:`judge` on one row record (a :meth:`Row.record` or a results.json record); a
    record without a comparator keeps its stated status."""
    comparator = record.get("comparator") or ""
    if not comparator:
        return record.get("status", INFO)
    number = lambda key: math.nan if record.get(key) is None else float(record[key])
    return judge(
        number("value"),
        comparator,
        number("threshold_value"),
        record.get("on_miss") or FAIL,
        excess=record.get("excess"),
        ci_high=record.get("ci_high"),
        rounding_excess=record.get("rounding_excess"),
    )


def to_frame(rows: Iterable[Row]) -> pd.DataFrame:
    """Rows → one tidy DataFrame, fixed columns first, ``extra`` keys as further columns."""
    frame = pd.DataFrame.from_records([row.record() for row in rows])
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    frame["schema_version"] = SCHEMA_VERSION
    extras = [c for c in frame.columns if c not in COLUMNS]
    return frame[COLUMNS + extras]


def check_status(statuses: Iterable[str]) -> str:
    """Status of a check from the statuses of its rows: the most severe one (SEVERITY order)."""
    present = set(statuses)
    return next((s for s in SEVERITY if s in present), NOT_RUN)


def baseline_rows(group: pd.DataFrame) -> pd.DataFrame:
    """The ERROR and NOT_RUN rows of ``group`` that the baseline caused (column ``twin`` == :data:`BASELINE`)."""
    if TWIN not in group.columns:
        return group.iloc[0:0]
    return group[group.status.isin([ERROR, NOT_RUN]) & (group[TWIN] == BASELINE)]


def judged_status(group: pd.DataFrame) -> str:
    """Status of one check from its rows: the most severe (:func:`check_status`), except that a check
    whose plain twin broke (:func:`baseline_rows`) and that measured no FAIL cannot be judged:
    INCONCLUSIVE, whatever the recompute twin did there (it ran without a working baseline)."""
    status = check_status(group.status)
    if status in (ERROR, NOT_RUN) and len(baseline_rows(group)):
        return INCONCLUSIVE
    return status


def check_summary(frame: pd.DataFrame, required: Iterable[str]) -> pd.DataFrame:
    """One row per check: ``check, status, required, rows, failing`` in first-seen order (``status`` by
    :func:`judged_status`)."""
    required = set(required)
    out = []
    for check, group in frame.groupby("check", sort=False):
        bad = group[group.status.isin([FAIL, ERROR, NOT_RUN])]
        out.append(
            {
                "check": check,
                "status": judged_status(group),
                "required": check in required,
                "rows": len(group),
                "failing": len(bad),
            }
        )
    for check in required - set(frame.check):
        out.append({"check": check, "status": NOT_RUN, "required": True, "rows": 0, "failing": 0})
    return pd.DataFrame(out, columns=["check", "status", "required", "rows", "failing"])


#: Twins that are the baseline (the plain twin and its A/A copy): an exception there is recorded as
#: ``twin`` = :data:`BASELINE`, a drift across ranks there is INCONCLUSIVE (reportgen.distributed.sync).
BASELINE_TWINS = ("plain", "aa")


def claim_verdict(frame: pd.DataFrame, required: Iterable[str]) -> str:
    """PASS only when every required check passes (docs/architecture.md, "Claim verdict").

    INCONCLUSIVE when any row says the claim cannot be judged (e.g. the plain twin is not
    reproducible against itself); it outranks everything else. Otherwise a required check
    fails the claim when it has any FAIL, ERROR or NOT_RUN row of the recompute twin, or no rows
    at all. A required check whose plain twin broke (:func:`judged_status`: INCONCLUSIVE) makes
    the claim INCONCLUSIVE unless another required check fails it: the recompute twin raising
    where the plain twin does not is still a failure. WARN and INFO rows do not fail it;
    FLAGGED rows never count, whatever the check.
    """
    if (frame.status == INCONCLUSIVE).any():
        return INCONCLUSIVE
    summary = check_summary(frame[frame.status != FLAGGED], required)
    summary = summary[summary.required]
    if summary.status.isin([FAIL, ERROR, NOT_RUN]).any():
        return FAIL
    return INCONCLUSIVE if (summary.status == INCONCLUSIVE).any() else PASS


def _plain_value(value: Any) -> Any:
    """numpy scalars → Python; NaN/None → None (dropped from the record)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def frame_to_json(frame: pd.DataFrame) -> str:
    """The frame as compact, lossless JSON records: the attached, signed results.json.

    One record per line; keys in column order; a record leaves out its empty (NaN/None)
    columns, which :func:`frame_from_json` restores as NaN. Floats are written with Python's
    shortest round-trip repr (exact for float64); +-inf as ``Infinity`` (Python's json).
    """
    columns = list(frame.columns)
    lines = []
    for values in frame.itertuples(index=False, name=None):
        record = {c: v for c, v in ((c, _plain_value(v)) for c, v in zip(columns, values)) if v is not None}
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
    extras = [c for c in frame.columns if c not in COLUMNS]
    return frame[COLUMNS + extras]
