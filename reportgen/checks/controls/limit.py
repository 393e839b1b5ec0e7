"""The report's detection limit (issue 43, item 2; docs/verdict.md, "the detection limit"): the smallest relative
error in a recomputed activation that gradient parity catches on this model at its tolerances.

The search is a bisection in log space over the decades 1e-6 … 1 (:data:`DECADES`): each probe scales the input
activation of the controls' region by ``1 + e`` only while it recomputes (:func:`faults.scaled_inputs`), runs one
forward and backward of a fresh recompute twin on the fixed batch and judges its parameter gradients with gradient
parity's own judge against the controls' plain run (no plain twin runs again). Seven decades take three probes.
A limit above bf16's unit roundoff (2^-8) is a WARN: a recompute at that precision would pass unseen.

Every probe is a row (role ``limit_probe``) and the limit is re-derived from them by :func:`limit_problems`
(``reportgen.verify``); page 1 and ``reportgen.compare`` read it with :func:`stated_limit`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

import pandas as pd
import torch

from reportgen.checks.controls.faults import modules_of, scaled_inputs
from reportgen.checks.controls.fixed_batch import Baseline, faulty_run, grad_rows
from reportgen.checks.controls.rows import named, tolerance_said, worst
from reportgen.config import CONTROLS
from reportgen.results import Role, Row, Status
from reportgen.twins.setup import Setup

#: The relative errors probed, one per decade, smallest first.
DECADES = tuple(10.0**k for k in range(-6, 1))
#: Unit roundoff (half the machine epsilon, ``torch.finfo(dtype).eps / 2``) of the precisions a recompute might
#: silently run at: a recomputed activation rounded to one is off by up to this much, relatively.
LOWER_PRECISIONS = {
    str(dtype).removeprefix("torch."): torch.finfo(dtype).eps / 2
    for dtype in (torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)
}
#: A limit above this is a WARN: bf16's unit roundoff, 2^-8 ≈ 3.9e-3.
BF16_ROUNDOFF = LOWER_PRECISIONS["bfloat16"]
ITEM = "detection limit"
METRIC = "detectable_relative_error"
#: A limit at most :data:`BF16_ROUNDOFF` passes.
COMPARATOR = "<="


def bisect(caught: Callable[[float], bool]) -> None:
    """Probe :data:`DECADES` by bisection for the smallest one ``caught(e)`` says is caught (it is assumed caught
    at every larger decade); returns nothing: ``caught`` records what it probed. At most
    ``ceil(log2(len(DECADES) + 1))`` probes (3), and the decade just below a caught one is always probed."""
    low, high = 0, len(DECADES)  # the answer's index lies in [low, high]; len(DECADES) = none caught
    while low < high:
        middle = (low + high) // 2
        if caught(DECADES[middle]):
            high = middle
        else:
            low = middle + 1


def _decade(value: float) -> int | None:
    """The index of ``value`` in :data:`DECADES` (within rounding), or None when it is none of them."""
    index = round(math.log10(value)) + 6 if value > 0 and math.isfinite(value) else -1
    return index if 0 <= index < len(DECADES) and math.isclose(DECADES[index], value, rel_tol=1e-9) else None


def limit_of(probes: Mapping[float, bool]) -> float:
    """The detection limit ``probes`` (``{relative error: caught}``) show: the smallest caught decade, when the
    decade below it was probed and missed (or it is the smallest decade); NaN when none was caught or the limit
    is not bracketed (unknown: the search probes the decade below)."""
    caught = [e for e, hit in probes.items() if hit]
    if not caught:
        return math.nan
    limit = min(caught)
    index = _decade(limit)
    if index is None:
        return math.nan
    missed_below = index == 0 or any(_decade(e) == index - 1 and not hit for e, hit in probes.items())
    return limit if missed_below else math.nan


def unseen_said(limit: float) -> str:
    """The lower-precision recomputes that would pass unseen under ``limit`` (NaN: every one), e.g.
    ``"float16 (unit roundoff 4.9e-04)"``, or ``""`` when none would."""
    unseen = [f"{name} (unit roundoff {u:.1e})" for name, u in LOWER_PRECISIONS.items() if not u >= limit]
    return ", ".join(unseen)


def probe(setup: Setup, base: Baseline, relative_error: float) -> Row:
    """One probe: region ``base.region`` recomputes from its activation times ``1 + relative_error``; caught when
    gradient parity fails some parameter gradient (or the faulty twin raises, an ERROR row in a run).

    Returns:
        An INFO row (role ``limit_probe``, metric ``caught``, value 1.0 or 0.0), with columns ``relative_error``,
        ``region``, ``caught_by``, ``worst_tolerance_used`` (the share of its tolerance the worst gradient used)
        and ``tolerance`` (the worst gradient's, for people; "" when the twin raised).
    """
    start = time.perf_counter()
    points, region = base.region.hook_points, base.region.path
    ran = faulty_run(setup, lambda twin: scaled_inputs(modules_of(twin, points), relative_error))
    said = f"region {named(region)} recomputed from its activation times 1 + {relative_error:.0e}"
    worst_used, tolerance = math.nan, ""
    if isinstance(ran, str):
        caught, caught_by, said = True, "exception", f"{said}: the faulty twin raised {ran}"
    else:
        rows = grad_rows(setup, base.plain.out, ran.out)
        failed = next((r for r in rows if r.status == Status.FAIL), None)
        top = worst(rows)
        worst_used = math.nan if top is None else float(top.extra["tolerance_used"])
        tolerance = "" if top is None else tolerance_said(top)
        caught, caught_by = failed is not None, "" if failed is None else failed.item
        said += (
            f": gradient parity fails {failed.item} ({failed.detail})"
            if failed is not None
            else f": not caught, the worst gradient used {worst_used:.2g} of its tolerance ({tolerance or 'none'})"
        )
    return Row.fact(
        CONTROLS,
        f"{ITEM} probe {relative_error:.0e}",
        Role.LIMIT_PROBE,
        said,
        metric="caught",
        value=float(caught),
        seconds=time.perf_counter() - start,
        extra={
            "relative_error": relative_error,
            "region": region,
            "caught_by": caught_by,
            "worst_tolerance_used": worst_used,
            "tolerance": tolerance,
        },
    )


def limit_row(probes: list[Row], region: str) -> Row:
    """The detection limit of ``probes`` (:func:`limit_of`), judged ``<= 2^-8`` (bf16's unit roundoff,
    :data:`BF16_ROUNDOFF`), WARN beyond, naming what would pass unseen.

    Args:
        probes: the ``limit_probe`` rows (:func:`probe`), in probe order.
        region: the region probed (plain naming).

    Returns:
        A row of unit ``relative`` (NaN when no probed error was caught), ``seconds`` the probes' total, columns
        ``region`` and ``probes`` (how many faulty backwards it cost).
    """
    limit = limit_of({float(r.extra["relative_error"]): r.value == 1.0 for r in probes})
    seconds = sum(r.seconds for r in probes)
    tolerance = next((r.extra["tolerance"] for r in reversed(probes) if r.extra.get("tolerance")), "its tolerance")
    probed = ", ".join(f"{r.extra['relative_error']:.0e} {'caught' if r.value == 1.0 else 'missed'}" for r in probes)
    cost = f"{len(probes)} probes ({probed}), each one faulty backward of the recompute twin on the fixed batch"
    cost += f", {seconds:.2f} s"
    said = f"{limit_said(limit, region, False)} (gradient parity at {tolerance}; {cost})"
    unseen = unseen_said(limit)
    said += f"; a recompute at {unseen} would pass unseen" if unseen else ""
    return Row.measured(
        CONTROLS,
        ITEM,
        METRIC,
        limit,
        "relative",
        comparator=COMPARATOR,
        threshold_value=BF16_ROUNDOFF,
        threshold=f"{COMPARATOR} {BF16_ROUNDOFF:.2g} (bf16's unit roundoff, 2^-8)",
        on_miss=Status.WARN,
        role=Role.DETECTION_LIMIT,
        detail=said,
        seconds=seconds,
        extra={"region": region, "probes": len(probes)},
    )


def not_stated(why: str, status: str = Status.INFO) -> Row:
    """A ``detection limit`` row without a value: why no limit was measured (``why`` is the sentence); INFO, or
    ERROR when the search itself raised."""
    detail = f"not stated: {why}"
    return Row.fact(CONTROLS, ITEM, Role.DETECTION_LIMIT, detail, status=status, metric=METRIC, unit="relative")


def detection_limit(setup: Setup, base: Baseline | str) -> list[Row]:
    """The detection limit of this run: its probes, then the limit (:func:`limit_row`); one INFO row when it
    cannot be measured (no baseline, gradient parity fails already, no floating activation to scale).

    Args:
        base: the controls' baseline (the plain run, the region), or why there is none.
    """
    if isinstance(base, str):
        return [not_stated(base)]
    if base.grads_fail:
        return [not_stated("gradient parity already fails without any fault")]
    if not base.region.floating_inputs:
        return [
            not_stated(
                f"no module of region {named(base.region.path)} recomputes from a floating activation (token ids "
                "only, or none ran again where a hook can see it), so there is none to scale"
            )
        ]
    probes: list[Row] = []

    def caught(relative_error: float) -> bool:
        probes.append(probe(setup, base, relative_error))
        return probes[-1].value == 1.0

    bisect(caught)
    return [*probes, limit_row(probes, base.region.path)]


# --------------------------------------------------------------------------- read back from a frame


def _rows(frame: pd.DataFrame, role: str) -> pd.DataFrame:
    """The rows of the detector controls with ``role``."""
    if "role" not in frame.columns:
        return frame.iloc[0:0]
    return frame[(frame.check == CONTROLS) & (frame.role == role)]


def stated_limit(frame: pd.DataFrame) -> dict | None:
    """The detection limit a results frame states, for page 1 and ``reportgen.compare``.

    Returns:
        ``{"value"`` (relative; None when none was caught or it is not stated), ``"region"``, ``"status"``,
        ``"detail"`` (the row's sentence, with its cost), ``"said"`` (page 1's sentence: the limit, and what would
        pass unseen when it is a WARN), ``"measured"`` (a limit was searched for)``}``; None when the frame has no
        limit row (controls off: page 1 says "detectors not proven" instead; an older run).
    """
    rows = _rows(frame, Role.DETECTION_LIMIT)
    if rows.empty:
        return None
    row = rows.iloc[0]
    value = pd.to_numeric(row.get("value"), errors="coerce")
    region = row.get("region")
    region = region if isinstance(region, str) else None
    measured = bool(row.get("comparator"))
    return {
        "value": None if pd.isna(value) else float(value),
        "region": region,
        "status": row.status,
        "detail": row.detail,
        "said": limit_said(float(value), region or "", row.status == Status.WARN) if measured else row.detail,
        "measured": measured,
    }


def limit_said(limit: float, region: str, unseen: bool) -> str:
    """Page 1's sentence: ``this report detects a recompute error of 1e-03 relative or larger in region "0"``
    (NaN: none up to 1), and with ``unseen`` the lower precisions that would pass unseen (:func:`unseen_said`)."""
    said = (
        f"this report detects a recompute error of {limit:.0e} relative or larger in region {named(region)}"
        if not math.isnan(limit)
        else f"this report detects no recompute error up to {DECADES[-1]:g} relative in region {named(region)}"
    )
    return said + (f"; a recompute at {unseen_said(limit)} would pass unseen" if unseen and unseen_said(limit) else "")


def _said(value: object) -> str:
    """A cell for a sentence: a number as ``%g``, a status or comparator as its text."""
    return f"{value:g}" if isinstance(value, float) else repr(str(value))


def limit_problems(frame: pd.DataFrame) -> list[str]:
    """Why the frame's detection limit does not follow from its probes, one line each (empty = it does): its value
    must be :func:`limit_of` the probe rows (each at a decade, in the limit's region), its threshold, comparator and
    ``on_miss`` those of :func:`limit_row`; a limit stated without a search has neither probes nor a value."""
    limits, probes = _rows(frame, Role.DETECTION_LIMIT), _rows(frame, Role.LIMIT_PROBE)
    if len(limits) > 1:
        return [f"results.json holds {len(limits)} detection-limit rows; a run states one"]
    if limits.empty:
        return [f"{len(probes)} detection-limit probe(s) but no limit row"] if len(probes) else []
    row = limits.iloc[0]
    value = pd.to_numeric(row.get("value"), errors="coerce")
    if not row.get("comparator"):
        return (
            []
            if probes.empty and pd.isna(value)
            else ["a detection limit stated without a search has probes or a value"]
        )
    errors = [float(e) for e in probes.get("relative_error", pd.Series(dtype=float))]
    problems = [f"a probe at {e!r}, which is no decade of 1e-06 … 1" for e in errors if _decade(e) is None]
    problems += [
        f"a probe in region {r!r}, the limit's is {row.get('region')!r}"
        for r in probes.region
        if r != row.get("region")
    ]
    derived = limit_of(dict(zip(errors, (float(v) == 1.0 for v in probes.value), strict=True)))
    if not ((pd.isna(value) and math.isnan(derived)) or value == derived):
        problems.append(f"the detection limit says {value:g}, its {len(probes)} probe(s) give {derived:g}")
    expected = {"threshold_value": BF16_ROUNDOFF, "comparator": COMPARATOR, "on_miss": Status.WARN}
    problems += [
        f"the detection limit's {column} is {_said(row.get(column))}, a limit's is {_said(want)}"
        for column, want in expected.items()
        if row.get(column) != want
    ]
    return problems
