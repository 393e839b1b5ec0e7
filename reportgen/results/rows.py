"""Row builders shared by the checks (checks never import each other): the gates on the baseline (A/A control,
a non-finite plain twin), the rounding envelope's judgement and the rows of trained twins. The rows of one
tensor or value are :mod:`reportgen.results.compared`'s, the ERROR rows :mod:`reportgen.results.raised`'s.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from reportgen.results.compared import allclose_row, tensor_row, tolerance_used, zero_count_row
from reportgen.results.distance import nonfinite_count
from reportgen.results.rounding import envelope
from reportgen.results.row import Role, Row, Status

#: The detail of a difference the rounding envelope accounts for (reportgen/results/rounding.py).
ROUNDING_LEVEL = "differs at rounding level, as any re-association would"

#: The report's sentence on the rounding envelope, for the sections that use it.
ROUNDING_NOTE = (
    "An item outside tolerance passes if within parity.rounding_factor × its rounding envelope (how far a "
    'plain twin moves when its gradients are nudged by the gradient tolerance; docs/verdict.md, "Rounding is not '
    'a fault"), for floating tensors and only while the recompute gradients are at rounding level.'
)


def effective_excess(row: Row) -> float:
    """How far past what passes ``row`` is: its tolerance ``excess``, or, when it carries a
    ``rounding_excess`` (difference minus the allowed multiple of its rounding envelope), the
    smaller of the two. <= 0 means the row passes; NaN counts as infinitely far."""
    excess = row.extra.get("excess", float("inf"))
    rounding = row.extra.get("rounding_excess")
    excess = float("inf") if excess != excess else excess
    return excess if rounding is None or rounding != rounding else min(excess, rounding)


def envelope_used(difference: float, envelope: float, factor: float) -> float:
    """How far inside its rounding allowance a difference is: ``difference / (factor × envelope)``
    (0.41 = uses 0.41 of what the envelope allows; <= 1 passes; inf for a zero envelope)."""
    allowed = factor * envelope
    return difference / allowed if allowed > 0 else (0.0 if difference == 0 else float("inf"))


def _uses(share: float, factor: float) -> str:
    """``uses 0.41 of its 2× rounding envelope`` (the margin a passing item has left)."""
    return f"uses {share:.2f} of its {factor:g}× rounding envelope"


def with_rounding(row: Row, envelope: float, factor: float) -> Row:
    """Add the rounding envelope to a tensor row (``max_abs_err``) and judge it again.

    Columns ``rounding_envelope`` (max abs difference of the rounding twin from plain for the
    same item), ``rounding_factor`` and ``rounding_excess = value - factor × envelope``; a row
    outside tolerance but with ``rounding_excess <= 0`` passes (:func:`reportgen.results.judge`)
    with a detail that says so. A row within tolerance keeps its detail.
    """
    rounding_excess = row.value - factor * envelope if row.value == row.value else float("inf")
    row.extra.update(rounding_envelope=envelope, rounding_factor=factor, rounding_excess=rounding_excess)
    if not row.extra.get("excess", 0.0) <= 0:
        row.detail = (
            f"{ROUNDING_LEVEL}: max abs {row.value:.3g} is within {factor:g}× the rounding envelope "
            f"{envelope:.3g} (the rounding twin; {_uses(envelope_used(row.value, envelope, factor), factor)})"
            if rounding_excess <= 0
            else f"{row.detail}; also outside {factor:g}× the rounding envelope {envelope:.3g}"
        )
    row.rejudge()
    return row


def aa_row(check: str, rows: list[Row]) -> Row:
    """The plain-vs-plain (A/A) control of ``rows``: how many compared items a second,
    independent plain twin does not reproduce within the same tolerance.

    Judged ``== 0`` with ``on_miss`` INCONCLUSIVE: when the plain twin does not even reproduce
    itself, a difference under recompute cannot be blamed on recomputation.
    """
    measured = [r for r in rows if "aa_excess" in r.extra]
    moved = [r for r in measured if not r.extra["aa_excess"] <= 0]
    worst = max((r.extra.get("aa_max_abs_err", float("inf")) for r in moved), default=0.0)
    names = ", ".join(r.item for r in moved[:4]) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")
    detail = (
        f"a second plain twin reproduces all {len(measured)} items of the plain twin"
        if not moved
        else f"the plain twin is not reproducible against itself: {len(moved)} of {len(measured)} items moved between "
        f"two plain runs ({names}); largest A/A difference {worst:.3g}. The claim cannot be judged"
    )
    extra = {"aa_items": len(measured), "aa_worst_abs_err": worst}
    item, metric, inconclusive = "plain vs plain (A/A control)", "aa_items_outside_tolerance", Status.INCONCLUSIVE
    return zero_count_row(
        check, item, metric, len(moved), "items", Role.AA, detail, on_miss=inconclusive, variant="aa", extra=extra
    )


def nonfinite_row(check: str, named: dict[str, Tensor | None]) -> Row:
    """Non-finite values (NaN/Inf) in the plain twin's loss or gradients: ``== 0``, else the claim
    is INCONCLUSIVE (the baseline itself is broken, never a recompute FAIL), naming the first such tensor."""
    bad = [(name, nonfinite_count(t)) for name, t in named.items() if t is not None and nonfinite_count(t)]
    detail = (
        "every plain loss and gradient is finite"
        if not bad
        else f"the plain twin computes non-finite values (NaN/Inf), first in {bad[0][0]} ({bad[0][1]} element(s)); "
        f"{len(bad)} tensor(s) in all. Nothing can be compared: fix the model, data or loss first"
    )
    extra = {"first_nonfinite": bad[0][0] if bad else ""}
    item, role, inconclusive = "plain twin finite", Role.NONFINITE, Status.INCONCLUSIVE
    count, unit = len(bad), "tensors"
    return zero_count_row(
        check, item, "nonfinite_tensors", count, unit, role, detail, on_miss=inconclusive, variant="plain", extra=extra
    )


def zero_gradients_row(check: str, grads: dict[str, Tensor | None]) -> Row:
    """How many of the plain twin's parameter gradients hold a non-zero element: ``>= 1``, else the claim is
    INCONCLUSIVE. All-zero gradients (a loss that does not depend on the parameters, a user step that zeroes
    them) make every gradient comparison equal and show nothing."""
    present = [g for g in grads.values() if g is not None]
    nonzero = sum(1 for g in present if g.count_nonzero())
    detail = (
        f"{nonzero} of the plain twin's {len(present)} parameter gradients hold non-zero values"
        if nonzero
        else f"every one of the plain twin's {len(present)} parameter gradients is zero (or missing): equal gradients "
        "show nothing here. Check that the loss depends on the parameters and that the training step does not "
        "zero the gradients before they are compared"
    )
    judged: dict[str, Any] = {"comparator": ">=", "threshold_value": 1.0, "on_miss": Status.INCONCLUSIVE}
    item, role = "plain gradients non-zero", Role.ZERO_GRADIENTS
    return Row.measured(
        check, item, "nonzero_gradients", float(nonzero), "tensors", role=role, detail=detail, variant="plain", **judged
    )


def trained_params_row(
    check: str,
    seed: int,
    plain: dict[str, Tensor],
    recompute: dict[str, Tensor],
    rtol: float | None,
    atol: float | None,
    factor: float,
    rounding: dict[str, Tensor] | None = None,
) -> Row:
    """One row for two trained twins' final parameters (``{plain name: tensor}`` each), judged
    ``allclose`` on the worst parameter's excess at the parity tolerances.

    Its value is the largest share of its tolerance any parameter uses (:func:`tolerance_used`,
    <= 1 within: the deciding number); ``max_rel_err`` is a column beside it. With ``rounding``
    (the rounding twin's final parameters, :mod:`reportgen.results.rounding`) each parameter outside
    tolerance is judged against ``factor`` times its rounding envelope too (column
    ``rounding_excess``: the worst parameter's, tolerance or envelope whichever passes more).
    """
    rows = [
        tensor_row(check, name, plain.get(name), recompute.get(name), rtol, atol)
        for name in sorted(set(plain) | set(recompute))
    ]
    envelopes = envelope(plain, rounding) if rounding is not None else {}
    for row in rows:
        if row.item in envelopes:
            with_rounding(row, envelopes[row.item], factor)
    worst = max(rows, key=lambda r: r.extra["excess"] if r.extra["excess"] == r.extra["excess"] else float("inf"))
    used = max((tolerance_used(r) for r in rows), default=0.0)
    rel = max((r.extra.get("max_rel_err", float("inf")) for r in rows), default=0.0)
    moved = [r for r in rows if not r.extra["excess"] <= 0]
    far = [r for r in rows if not effective_excess(r) <= 0]
    extra = {"seed": seed, "excess": worst.extra["excess"], "worst_item": worst.item, "items": len(rows)}
    extra |= {"items_outside": len(moved), "max_rel_err": rel, "max_abs_err": worst.value}
    detail = (
        f"all {len(rows)} trained parameters within tolerance (the worst, {worst.item}, uses {used:.0%} of it)"
        if not moved
        else f"{len(moved)} of {len(rows)} trained parameters differ beyond tolerance (worst {worst.item}, "
        f"max abs {worst.value:.3g}, {used:.3g}× its tolerance)"
    )
    if moved and envelopes:
        extra.update(
            rounding_excess=max(effective_excess(r) for r in rows),
            rounding_factor=factor,
            rounding_envelope=max(r.extra.get("rounding_envelope", float("nan")) for r in moved),
        )
        closest = max(envelope_used(r.value, r.extra.get("rounding_envelope", 0.0), factor) for r in moved)
        detail += (
            f"; every one {ROUNDING_LEVEL} (within {factor:g}× the rounding envelope, largest "
            f"{extra['rounding_envelope']:.3g}; the closest {_uses(closest, factor)})"
            if not far
            else f"; {len(far)} also outside {factor:g}× the rounding envelope (e.g. {far[0].item}): the twins trained apart"
        )
    elif moved:
        detail += ": the twins trained apart"
    return allclose_row(
        check, f"seed {seed}", "final_params_tolerance_used", used, worst.threshold, Role.FINAL_PARAMS, detail, extra
    )


def difference_detail(plain: float, recompute: float, metric: str, higher_is_better: bool) -> str:
    """One sentence on what recompute did to the metric, e.g. ``recompute is worse by 0.012 (+3.1%)``."""
    if plain == recompute:
        return f"identical: {metric} {plain:.6g} in both runs"
    delta = recompute - plain
    better = (delta > 0) == bool(higher_is_better)
    rel = f" ({delta / abs(plain):+.2%} of plain)" if plain else ""
    return (
        f"plain {plain:.6g}, recompute {recompute:.6g}: recompute is {'better' if better else 'worse'} "
        f"by {abs(delta):.3g}{rel}"
    )


def metric_diff_row(
    check: str,
    seed: int,
    plain: float,
    recompute: float,
    allowed: float,
    metric: str,
    higher_is_better: bool,
    rounding: float | None = None,
    factor: float = 2.0,
) -> Row:
    """``|recompute - plain|`` of the held-out metric (row of ``check``) judged ``<= allowed``; with the rounding
    twin's metric ``rounding``, a difference within ``factor`` × ``|rounding - plain|`` passes
    too (column ``rounding_excess``)."""
    diff = abs(recompute - plain)
    extra = {"seed": seed, "plain_value": plain, "recompute_value": recompute}
    detail = difference_detail(plain, recompute, metric, higher_is_better)
    if rounding is not None:
        envelope_ = abs(rounding - plain)
        extra.update(rounding_envelope=envelope_, rounding_factor=factor, rounding_excess=diff - factor * envelope_)
        if diff > allowed:
            detail += (
                f"; {ROUNDING_LEVEL} (within {factor:g}× the rounding twin's {envelope_:.3g}: "
                f"{_uses(envelope_used(diff, envelope_, factor), factor)})"
                if diff <= factor * envelope_
                else f"; also outside {factor:g}× the rounding envelope {envelope_:.3g}"
            )
    judged: dict[str, Any] = {"comparator": "<=", "threshold_value": allowed, "threshold": f"{allowed:g}"}
    item, role = f"seed {seed}", Role.METRIC_DIFF
    return Row.measured(check, item, f"abs_diff_{metric}", diff, "", role=role, detail=detail, extra=extra, **judged)


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
    judged: dict[str, Any] = {"comparator": "allclose", "threshold_value": math.nan, "threshold": "allclose per item"}
    more: dict[str, Any] = {"on_miss": on_miss, "variant": variant, "extra": extra}
    return Row.measured(
        check, f"step {step}", metric, value, unit, role=Role.TRAJECTORY, detail=detail, **judged, **more
    )
