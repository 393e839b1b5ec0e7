"""The later-step detector control: the stale-input fault switched on from step k; trajectory parity must first
fail at step k, not before."""

from __future__ import annotations

from reportgen.checks.controls.faults import Switch, modules_of, stale_inputs
from reportgen.checks.controls.fixed_batch import Baseline
from reportgen.checks.controls.rows import (
    LATER,
    control_row,
    moved,
    named,
    not_needed,
    stated_row,
    tolerance_said,
    unused_said,
    worst,
)
from reportgen.config import ParityConfig
from reportgen.results import Role, Row, Status
from reportgen.results.raised import exception_message
from reportgen.training.trajectory import TwinRaised, lockstep, trajectory
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import snapshot_rows

#: The step (1-based) from which the later-step control's fault acts: step 1 stays equal, the case the
#: trajectory check exists for (clamped to ``parity.steps``).
LATER_STEP = 2


def later(setup: Setup, base: Baseline) -> Row:
    """Control 5: the stale input (fault 1), on from step k = :data:`LATER_STEP`; trajectory parity must first fail at
    the first step the fault acts in (k, or later when the region is skipped in step k), none before.

    A plain and a faulty recompute twin take up to ``parity.steps`` training steps in lockstep, the trajectory
    check's (the run's training step, :mod:`reportgen.twins.step`) on its batches and
    seeds; after every step their states are compared as the trajectory check compares them
    (:func:`reportgen.twins.snapshot.snapshot_rows`, tolerance alone).
    """
    parity: ParityConfig = setup.config.parity
    k = min(LATER_STEP, int(parity.steps))
    if not base.region.rollable_inputs:
        return stated_row(
            LATER, f"not applicable: the recomputed region {named(base.region.path)} has no input to roll"
        )
    said = f"region {named(base.region.path)} recomputed from another example's input from step {k} on"
    try:
        first, acted, rows, grads_moved = _steps(setup, base, k)
    except FaultRaised as exc:  # the run would see it: the recompute twin's ERROR row fails trajectory parity
        said = f"{said}: the faulty twin raised {exc}; trajectory parity states that as an ERROR"
        return control_row(LATER, True, said, caught_by="exception", extra={"region": base.region.path})
    failing = [r.item for r in rows if r.status == Status.FAIL]
    extra = {"region": base.region.path, "step": k, "first_failing_step": first, "fault_step": acted}
    if first and (not acted or first < acted):
        return not_needed(LATER, [f"step {first}: {', '.join(failing[:2])}"])
    if not acted:
        return stated_row(
            LATER,
            f"not applicable: region {named(base.region.path)} did not recompute in steps {k} to {parity.steps} "
            "(skipped, e.g. by LayerDrop or routing), so the fault never acted",
            extra=extra,
        )
    said += f"; it first acted at step {acted}" if acted != k else ""
    if first == acted:
        return control_row(
            LATER,
            True,
            f"{said}: trajectory parity first fails at step {acted} ({', '.join(failing[:3])}), none before",
            caught_by=f"step {acted}",
            extra=extra,
        )
    return control_row(
        LATER,
        False,
        f"{said}: trajectory parity is blind to it: {_blind_said(base, rows, acted, grads_moved)}",
        extra=extra,
    )


def _steps(setup: Setup, base: Baseline, k: int) -> tuple[int, int, list[Row], bool]:
    """Step a plain and a faulty recompute twin in lockstep, the fault on from step ``k``, until trajectory
    parity fails or the step the fault first acted in is compared.

    Returns:
        ``(first failing step or 0, first step the fault acted in or 0, that step's comparison rows, whether
        the fault moved that step's gradients at all)``.

    Raises:
        FaultRaised: the faulty twin raised once the fault had acted (torch's CheckpointError on a rerouted
            region, a shape error): a fault the run sees.
    """
    rtol, atol = setup.tolerance()
    ignore = setup.config.state.ignore_attributes
    switch = Switch(on=k <= 1)
    plain, faulty = setup.twin(False), setup.twin(True)  # two training states, as trajectory parity holds
    rows: list[Row] = []
    with stale_inputs(modules_of(faulty.model, base.region.hook_points), switch):
        twins = {
            "plain": trajectory(setup, False, twin=plain, digest_grads=True),
            "faulty": trajectory(setup, True, twin=faulty, digest_grads=True),
        }
        try:
            for step, views in enumerate(lockstep(twins), 1):
                rows = snapshot_rows(views["plain"], views["faulty"], None, rtol, atol, ignore)
                acted = step if switch.acted else 0
                if any(r.status == Status.FAIL for r in rows):
                    return step, acted, rows, True
                if acted:  # did the fault move this step's gradients at all (their bytes, before the step's apply)
                    digests = [twin.last.grad_digests if twin.last else {} for twin in (plain, faulty)]
                    return 0, acted, rows, digests[0] != digests[1]
                switch.on = step + 1 >= k
        except TwinRaised as exc:
            if exc.twin == "faulty" and switch.acted:
                raise FaultRaised(f"{type(exc.error).__name__}: {exception_message(exc.error)}") from exc
            raise
    return 0, 0, rows, False


class FaultRaised(Exception):
    """The faulty twin raised once the injected fault had acted; the message says what it raised."""


def _blind_said(base: Baseline, rows: list[Row], step: int, grads_moved: bool) -> str:
    """Why trajectory parity did not fail at ``step``, the step the fault acted in; ``grads_moved``: the fault
    moved that step's gradients."""
    if not moved([r for r in rows if r.role != Role.RNG]):
        if grads_moved:
            return (
                f"the fault moved the gradients of step {step}, yet no parameter or optimizer state moved at all: the "
                "training step throws the gradients away (a before_step that zeroes them, a learning rate of 0), so "
                "no trajectory can show a recompute fault. Train with a step that applies the gradients"
            )
        return unused_said(base.region.path, base.region_grad, "parameter or optimizer state")
    top = worst(rows)
    if top is None:
        return f"nothing was compared after step {step}"
    return (
        f"after step {step} the largest move was in {top.item}, {top.value:.3g} (it used "
        f"{top.extra['tolerance_used']:.2g} of its tolerance {tolerance_said(top)}): the tolerance is too wide for "
        "how far one step moves the parameters; lower parity.atol and parity.rtol"
    )
