"""Result rows and the one judge (the row contract, docs/architecture.md), statuses and the results schema's
columns. Checks *measure*; only :func:`judge` turns a row's value, threshold and comparator into a status, so
``reportgen.verify`` recomputes every status from the signed values with the same code."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from reportgen.results.role import Role


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
    #: the claim cannot be judged (plain twin not reproducible, plain run raised, non-finite plain loss,
    #: or a baseline that already recomputes). Exit code 3.
    INCONCLUSIVE = "INCONCLUSIVE"


#: Worst first: the status of a check is the first of these that any of its rows has. A
#: measured FAIL outranks an ERROR: it is a definite answer, an ERROR only says "unknown".
SEVERITY = [Status.INCONCLUSIVE, Status.FAIL, Status.ERROR, Status.NOT_RUN]
SEVERITY += [Status.WARN, Status.PASS, Status.FLAGGED, Status.INFO]
#: Column ``twin`` of an ERROR or NOT_RUN row: the twin that broke. :data:`BASELINE` ("plain") means the plain
#: twin itself raised, computed non-finite values or (sharded) drifted across ranks: the check has no baseline
#: and cannot be judged (:func:`judged_status`), which is never a recompute failure. "recompute" (or no
#: column) is a failure of the recompute twin, judged as ERROR.
TWIN = "twin"
BASELINE = "plain"
#: Twins that are the baseline (the plain twin and its A/A copy): an exception there is recorded as
#: ``twin`` = :data:`BASELINE`, a drift across ranks there is INCONCLUSIVE (reportgen.distributed.sync).
BASELINE_TWINS = ("plain", "aa")
#: The fixed columns of results.csv/json, in order (a row's ``extra`` keys follow them).
COLUMNS = ["check", "item", "variant", "role", "metric", "unit", "value", "threshold", "threshold_value"]
COLUMNS += ["comparator", "on_miss", "status", "detail", "seconds", "schema_version"]
#: Comparators :func:`judge` knows (``allclose`` reads the row's ``excess``, ``ci<=`` its ``ci_high`` too).
COMPARATORS = ("<=", "<", ">=", ">", "==", "allclose", "ci<=")


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
    status: str = Status.INFO
    detail: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    role: str = ""
    unit: str = ""
    threshold_value: float = math.nan
    on_miss: str = Status.FAIL

    def __post_init__(self) -> None:
        self.rejudge()

    @classmethod
    def fact(
        cls,
        check: str,
        item: str,
        role: str,
        detail: str,
        *,
        status: str = Status.INFO,
        metric: str = "",
        value: float = math.nan,
        unit: str = "",
        variant: str = "recompute",
        seconds: float = 0.0,
        extra: Mapping[str, Any] | None = None,
    ) -> Row:
        """A stated fact, not judged: INFO by default (or WARN, ERROR, NOT_RUN, FLAGGED, INCONCLUSIVE;
        never PASS or FAIL, which only :func:`judge` gives). ``metric`` defaults to ``role``.

        Example: ``Row.fact(MEMORY, "policy", Role.NOTE, "recomputes 4 of 6 blocks")``.
        """
        named: dict[str, Any] = {"check": check, "item": item, "variant": variant, "value": value, "unit": unit}
        named |= {"status": status, "role": role, "detail": detail, "seconds": seconds, "extra": dict(extra or {})}
        return cls(metric=metric or str(role), **named)

    @classmethod
    def not_run(cls, check: str, detail: str, *, item: str = "not run", role: str = Role.DISABLED) -> Row:
        """A NOT_RUN row of ``check`` (role ``disabled``, metric ``not_run``): the part did not run, ``detail`` says why."""
        return cls.fact(check, item, role, detail, status=Status.NOT_RUN, metric="not_run")

    @classmethod
    def measured(
        cls,
        check: str,
        item: str,
        metric: str,
        value: float,
        unit: str,
        *,
        comparator: str,
        threshold_value: float,
        role: str,
        detail: str,
        threshold: str | None = None,
        on_miss: str = Status.FAIL,
        variant: str = "recompute",
        seconds: float = 0.0,
        extra: Mapping[str, Any] | None = None,
    ) -> Row:
        """A measurement judged at once by :func:`judge`: ``value`` (in ``unit``) ``comparator``
        ``threshold_value``, else ``on_miss``. ``threshold`` (for people) defaults to
        ``"{comparator} {threshold_value:g}"``; pass ``""`` for none (an ``allclose`` row without tolerances).

        Example: ``Row.measured(MEMORY, "saving", "saving_share", 0.4, "share", comparator=">=",
        threshold_value=0.1, role=Role.SAVING, detail="...", on_miss=Status.WARN)``.
        """
        row = cls.fact(check, item, role, detail, metric=metric, value=value, unit=unit, variant=variant, extra=extra)
        row.threshold = f"{comparator} {threshold_value:g}" if threshold is None else threshold
        row.threshold_value, row.comparator, row.on_miss, row.seconds = threshold_value, comparator, on_miss, seconds
        row.rejudge()
        return row

    def rejudge(self) -> None:
        """Set ``status`` from the numbers again (after a builder added a column ``judge`` reads,
        e.g. ``rounding_excess``); a row without a comparator keeps its stated status."""
        if self.comparator:
            self.status = judge_record(vars(self) | self.extra)

    def record(self) -> dict[str, Any]:
        """The row as one flat record: fixed columns, then ``extra``'s keys."""
        record = asdict(self)
        record.update(record.pop("extra"))
        return record


def to_float(value: Any) -> float:
    """``float(value)``, or NaN when it is not a number (None, a string that is not one)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def judge(
    value: float,
    comparator: str,
    threshold_value: float,
    on_miss: str = Status.FAIL,
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
        ci_high: ``ci<=`` only: the upper end of the value's confidence interval; a value within the
            threshold whose ``ci_high`` is past it (or NaN) is WARN, not conclusive.
        rounding_excess: ``allclose`` and ``<=`` only: the difference minus the allowed multiple
            of the rounding envelope (reportgen/results/rounding.py); finite and <= 0 passes a row that
            misses its tolerance: the difference is one rounding-level noise would also make.

    Returns:
        PASS, WARN or ``on_miss``.

    Raises:
        ValueError: an unknown comparator.
    """
    value, threshold_value = to_float(value), to_float(threshold_value)
    rounding = to_float(rounding_excess)
    if comparator in ("allclose", "<=") and math.isfinite(rounding) and rounding <= 0:
        return Status.PASS
    if comparator == "allclose":
        excess = to_float(excess)
        return Status.PASS if math.isfinite(excess) and excess <= 0 else on_miss
    if comparator not in COMPARATORS:
        raise ValueError(f"unknown comparator {comparator!r}; known: {', '.join(COMPARATORS)}")
    if math.isnan(value) or math.isnan(threshold_value):
        return on_miss
    if comparator == "ci<=":
        if value > threshold_value:
            return on_miss
        return Status.WARN if to_float(ci_high) > threshold_value or math.isnan(to_float(ci_high)) else Status.PASS
    met = {
        "<=": value <= threshold_value,
        "<": value < threshold_value,
        ">=": value >= threshold_value,
        ">": value > threshold_value,
        "==": value == threshold_value,
    }[comparator]
    return Status.PASS if met else on_miss


def judge_record(record: Mapping[str, Any]) -> str:
    """:func:`judge` on one row record (a :meth:`Row.record` or a results.json record); a
    record without a comparator keeps its stated status."""
    comparator = record.get("comparator") or ""
    if not comparator:
        return record.get("status", Status.INFO)
    number = lambda key: math.nan if record.get(key) is None else float(record[key])
    columns = {key: record.get(key) for key in ("excess", "ci_high", "rounding_excess")}  # what some comparators read
    return judge(
        number("value"), comparator, number("threshold_value"), record.get("on_miss") or Status.FAIL, **columns
    )
