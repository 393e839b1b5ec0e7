"""Rows that several checks judge the same way: a count that must be zero (lost gradients, recomputing
modules of the plain twin, output leaves changed in backward, a rank's tensors outside tolerance,
skipped-step differences) and one optimizer step of a trajectory judged ``allclose`` per item (trajectory
parity, single-process and sharded). Not a check: it holds no ``CHECK``; the row builders every layer
shares are in :mod:`reportgen.results.rows`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from reportgen.results import Role, Row

#: How a count that must be zero is judged: ``== 0``, with ``"0"`` as its threshold for people.
ZERO: Mapping[str, Any] = {"comparator": "==", "threshold_value": 0.0, "threshold": "0"}

#: How one step of a trajectory is judged: ``allclose`` on its ``excess`` column, item by item.
ALLCLOSE: Mapping[str, Any] = {"comparator": "allclose", "threshold_value": math.nan, "threshold": "allclose per item"}


def zero_count_row(
    check: str, item: str, metric: str, count: float, unit: str, role: str, detail: str, **columns: Any
) -> Row:
    """``count`` (in ``unit``) judged :data:`ZERO`. ``columns``: what else :meth:`Row.measured` takes, e.g. ``on_miss``
    (FAIL by default; WARN for an advisory count, INCONCLUSIVE for one that breaks the baseline), ``variant``,
    ``seconds``, ``extra``."""
    return Row.measured(check, item, metric, float(count), unit, role=role, detail=detail, **ZERO, **columns)


def step_row(
    check: str,
    step: int,
    metric: str,
    value: float,
    unit: str,
    variant: str,
    on_miss: str,
    moved: list[str],
    extra: dict,
) -> Row:
    """One optimizer step of a trajectory, ``variant`` (recompute, or the A/A twin) against plain, judged
    ``allclose`` per item on ``extra["excess"]`` (the worst compared item's; ``on_miss`` when past it: FAIL, or
    INCONCLUSIVE for the A/A twin). ``moved``: the items outside tolerance, named in the detail;
    ``extra["items"]``: how many were compared."""
    items = extra["items"]
    detail = (
        f"all {items} items within tolerance"
        if not moved
        else f"{len(moved)} of {items} items outside tolerance, e.g. {', '.join(moved[:3])}"
    )
    return Row.measured(
        check,
        f"step {step}",
        metric,
        value,
        unit,
        role=Role.TRAJECTORY,
        detail=detail,
        on_miss=on_miss,
        variant=variant,
        extra=extra,
        **ALLCLOSE,
    )
