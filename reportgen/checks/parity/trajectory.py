"""Trajectory parity: the plain twin, a second plain twin copied from the same build (A/A) and the recompute twin
each take ``parity.steps`` training steps (the run's training step, :mod:`reportgen.twins.step`)
on the same batches (drawn from the task with ``seed``), every generator seeded identically before each forward;
after every step their whole state is compared. It catches faults that leave step 1 bitwise equal and show from
step 2 on (state the forward reads, then updates twice per step under recomputation). When some step misses
tolerance, the rounding twin takes the same steps (docs/verdict.md, "Rounding is not a fault").
"""

from __future__ import annotations

import math

import torch

from reportgen.checks.base import Check, Section
from reportgen.checks.base.plots import trajectory_plots
from reportgen.checks.base.run import Run
from reportgen.config import TRAJECTORY, ParityConfig
from reportgen.results import Role, Row, Status
from reportgen.results.compared import tolerance_used
from reportgen.results.raised import run_twin
from reportgen.results.rounding import GradientNudge, grads_at_rounding_level
from reportgen.results.rows import ROUNDING_LEVEL, ROUNDING_NOTE, effective_excess, nonfinite_row, step_row
from reportgen.training.trajectory import TwinRaised, lockstep, trajectory
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import (
    aa_columns,
    outside_tolerance,
    snapshot_rows,
    with_aa,
    with_envelope,
)


def _twin_error(exc: TwinRaised) -> list[Row]:
    """The ERROR row of the twin that raised, as :func:`reportgen.results.raised.run_twin` makes it."""
    where = {"aa": "plain", "rounding": "rounding twin"}.get(exc.twin, exc.twin)

    def reraise():
        raise exc.error

    return run_twin(TRAJECTORY, where, reraise)[1]


def step_rows(step: int, rows: list[Row]) -> list[Row]:
    """Two rows for one step, each valued by the largest share of its tolerance any item uses
    (:func:`reportgen.results.compared.tolerance_used`; <= 1 passes, the number that decides): recompute vs
    plain (judged ``allclose`` on the worst excess over
    every compared item, passed too when every item outside tolerance is within its rounding
    envelope: column ``rounding_excess``, the worst item's) and A/A vs plain (judged the same
    way on tolerance alone, INCONCLUSIVE when missed)."""
    out = []
    for variant, key, on_miss in (("recompute", "excess", "FAIL"), ("aa", "aa_excess", Status.INCONCLUSIVE)):
        excess = [(r.extra.get(key, math.inf), r) for r in rows]
        worst_excess, worst = max(excess, key=lambda e: (not e[0] <= 0, e[0] if e[0] == e[0] else math.inf))
        moved = [r.item for e, r in excess if not e <= 0]
        largest = max((tolerance_used(r, "" if variant == "recompute" else "aa_") for r in rows), default=0.0)
        extra = {
            "step": step,
            "excess": worst_excess,
            "worst_item": worst.item,
            "items": len(rows),
            "items_outside": len(moved),
        }
        rounding = ""
        if variant == "recompute" and moved and any("rounding_excess" in r.extra for r in rows):
            extra.update(_rounding_summary(rows))
            far = [r.item for r in rows if not effective_excess(r) <= 0]
            rounding = (
                f"; every one {ROUNDING_LEVEL} (within {extra['rounding_factor']:g}× the rounding envelope, "
                f"largest {extra['rounding_envelope']:.3g})"
                if not far
                else f"; {len(far)} also outside the rounding envelope, e.g. {', '.join(far[:3])}"
            )
        out.append(step_row(TRAJECTORY, step, "tolerance_used", largest, "", variant, on_miss, moved, extra))
        out[-1].detail += rounding
    return out


def _rounding_summary(rows: list[Row]) -> dict[str, float]:
    """Rounding columns of a step row: the worst item's effective excess (tolerance or envelope,
    whichever passes more), the largest envelope among the items outside tolerance, the factor."""
    moved = [r for r in rows if not r.extra.get("excess", 0.0) <= 0]
    return {
        "rounding_excess": max(effective_excess(r) for r in rows),
        "rounding_envelope": max(
            (r.extra.get("rounding_envelope", math.nan) for r in moved if r.extra.get("rounding_envelope") is not None),
            default=math.nan,
        ),
        "rounding_factor": next((r.extra["rounding_factor"] for r in rows if "rounding_factor" in r.extra), math.nan),
    }


def trajectory_parity(run: Run) -> list[Row]:
    """Run the three trajectories and compare them step by step.

    Returns:
        Per step, a ``recompute`` row and an ``aa`` row (see :func:`step_rows`), and one
        ``first_diverging_step`` row (INFO: the first step at which recompute leaves tolerance,
        0 when none, naming the items).
    """
    setup = run.setup
    rtol, atol = setup.tolerance()
    ignore = setup.config.state.ignore_attributes
    try:  # two twins resident at a time: plain beside its A/A twin, then beside the recompute twin
        aa = [
            aa_columns(v["plain"], v["aa"], rtol, atol)
            for v in lockstep({"plain": trajectory(setup, False), "aa": trajectory(setup, False)})
        ]
        per_step, losses, finite = [], [], None
        for k, v in enumerate(lockstep({"plain": trajectory(setup, False), "recompute": trajectory(setup, True)})):
            rows = snapshot_rows(v["plain"], v["recompute"], None, rtol, atol, ignore)
            per_step.append([x for x in with_aa(rows, aa[k]) if x.role != Role.IGNORED])
            losses.append(v["plain"].loss)
            if k + 1 == setup.config.parity.steps:
                finite = _plain_finite(losses, v["plain"].params)
    except TwinRaised as exc:
        return _twin_error(exc)
    out: list[Row] = _with_rounding_twin(setup, per_step)
    finite = finite if finite is not None else _plain_finite(losses, {})
    out.append(finite)
    first, first_items = 0, []
    for k, rows in enumerate(per_step, start=1):
        out += step_rows(k, rows)
        if not first and not out[-2].status == "PASS":
            first, first_items = k, [x.item for x in rows if not effective_excess(x) <= 0]
    steps = len(per_step)
    rounded = sum(
        1 for row in out if row.variant == "recompute" and row.extra.get("items_outside") and row.status == "PASS"
    )
    held = (
        f"recompute stays within tolerance of plain for all {steps} steps"
        if not rounded
        else f"recompute stays within tolerance of plain, or within the rounding envelope, for all {steps} steps "
        f"({rounded} of them outside tolerance only at rounding level)"
    )
    detail = (
        held
        if not first
        else f"recompute first leaves tolerance at step {first} of {steps}: {', '.join(first_items[:4])}"
        + (f" and {len(first_items) - 4} more" if len(first_items) > 4 else "")
        + (
            "; step 1 was equal, so the fault shows only after a step: state read in forward and updated after it"
            if first > 1 and finite.status == Status.PASS
            else ""
        )
    )
    extra = {"steps": steps, "first_items": ", ".join(first_items[:8])}
    item, metric = "first diverging step", "first_diverging_step"
    out.append(
        Row.fact(TRAJECTORY, item, Role.FIRST_DIVERGENCE, detail, metric=metric, value=first, unit="step", extra=extra)
    )
    return out


def _plain_finite(losses: list[torch.Tensor], params: dict[str, torch.Tensor]) -> Row:
    """The plain trajectory's loss at every step and its weights after the last (``params``): a NaN/Inf
    there (too high a learning rate, an overflowing init or dtype) makes every later comparison unequal
    without any recomputation, so the row (``Role.NONFINITE``, INCONCLUSIVE when missed) names the first one."""
    named = {f"loss at step {k}": loss for k, loss in enumerate(losses, start=1)}
    named |= {f"{name} after step {len(losses)}": t for name, t in params.items()}
    return nonfinite_row(TRAJECTORY, named)


def _with_rounding_twin(setup: Setup, per_step: list[list[Row]]) -> list[Row]:
    """Run the rounding twin's trajectory when some step has a floating-state item outside
    tolerance (and ``parity.rounding_envelope`` is on); judge each step's rows against its
    envelope while the recompute gradients stay at rounding level (every earlier step included).
    The plain and recompute trajectories run again beside it (three twins resident: only here).

    Returns:
        ERROR rows when a twin raised (the steps keep their tolerance verdicts), else [].
    """
    parity: ParityConfig = setup.config.parity
    if not parity.rounding_envelope or not any(outside_tolerance(rows) for rows in per_step):
        return []
    rtol, atol = setup.tolerance()
    factor = parity.rounding_factor
    twins = {
        "plain": trajectory(setup, False, keep_grads=True),
        "recompute": trajectory(setup, True, keep_grads=True),
        "rounding": trajectory(setup, False, GradientNudge(rtol, atol, setup.config.seed), keep_grads=True),
    }
    try:
        for k, (v, rows) in enumerate(zip(lockstep(twins), per_step)):
            p, r, q = v["plain"], v["recompute"], v["rounding"]
            if not grads_at_rounding_level(p.grads, r.grads, q.grads if k else None, rtol, atol, factor):
                break  # the envelope models gradient noise; from here the gradients themselves differ
            with_envelope(rows, p, q, factor)
    except TwinRaised as exc:
        return _twin_error(exc)
    return []


CHECK = Check(
    trajectory_parity,
    (
        Section(
            TRAJECTORY,
            "Several optimizer steps on the training stream for the plain twin, a second plain twin (A/A) and the "
            "recompute twin, compared after every step: parameters, optimizer state, buffers, module attributes and generator "
            "states. " + ROUNDING_NOTE,
            template="sections/trajectory-parity.html.j2",
            plotter=trajectory_plots,
            roles=(Role.TRAJECTORY, Role.NONFINITE, Role.FIRST_DIVERGENCE),
        ),
    ),
)
