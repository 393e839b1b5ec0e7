"""The later-step detector control: the activation fault at 100 %, switched on from step k; trajectory
parity must first fail at step k, not before."""

from __future__ import annotations

import torch
from hydra.utils import instantiate

from reportgen.checks.controls.baseline import Baseline
from reportgen.checks.controls.faults import Switch, shifted_inputs
from reportgen.checks.controls.region import modules_of
from reportgen.checks.controls.rows import (
    LATER,
    control_row,
    inputs_not_floating,
    named,
    not_needed,
    stated_row,
    tolerance_said,
    unused_said,
    worst,
)
from reportgen.config import TRAJECTORY, ParityConfig
from reportgen.results import Role, Row, Status
from reportgen.rng import fingerprint, seeded
from reportgen.structure import call_model
from reportgen.tasks import batch_to
from reportgen.training.loop import step_seed
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import snapshot_rows, take

#: The step (1-based) from which the later-step control's fault acts: step 1 stays equal, the case the
#: trajectory check exists for (clamped to ``parity.steps``).
LATER_STEP = 2


def later(setup: Setup, base: Baseline) -> Row:
    """Control 5: fault 1 at 100 %, on from step k = :data:`LATER_STEP`; trajectory parity must first fail at
    the first step the fault acts in (k, or later when the region is skipped in step k), none before.

    A plain and a faulty recompute twin take up to ``parity.steps`` steps of ``parity.optimizer`` in lockstep
    on the trajectory check's batches and seeds; after every step their states are compared as the
    trajectory check compares them (:func:`reportgen.twins.snapshot.snapshot_rows`, tolerance alone).
    """
    parity: ParityConfig = setup.config.parity
    k = min(LATER_STEP, int(parity.steps))
    if not base.region.floating_inputs:
        return inputs_not_floating(LATER, base.region)
    said = (
        f"region {named(base.region.path)} recomputed from its activation moved by 100 % of its size from step {k} on"
    )
    first, acted, rows = _steps(setup, base, k)
    failing = [r.item for r in rows if r.status == Status.FAIL]
    extra = {"region": base.region.path, "step": k, "first_failing_step": first, "fault_step": acted}
    if first and (not acted or first < acted):
        return not_needed(LATER, TRAJECTORY, [f"step {first}: {', '.join(failing[:2])}"])
    if not acted:
        return stated_row(
            LATER,
            TRAJECTORY,
            f"not applicable: region {named(base.region.path)} did not recompute in steps {k} to {parity.steps} "
            "(skipped, e.g. by LayerDrop or routing), so the fault never acted",
            extra=extra,
        )
    said += f"; it first acted at step {acted}" if acted != k else ""
    if first == acted:
        return control_row(
            LATER,
            True,
            TRAJECTORY,
            f"{said}: trajectory parity first fails at step {acted} ({', '.join(failing[:3])}), none before",
            size="100 %",
            caught_by=f"step {acted}",
            extra=extra,
        )
    return control_row(
        LATER,
        False,
        TRAJECTORY,
        f"{said}: trajectory parity is blind to it: {_blind_said(base, rows, acted)}",
        size="100 %",
        extra=extra,
    )


def _steps(setup: Setup, base: Baseline, k: int) -> tuple[int, int, list[Row]]:
    """Step a plain and a faulty recompute twin in lockstep, the fault on from step ``k``, until trajectory
    parity fails or the step the fault first acted in is compared.

    Returns:
        ``(first failing step or 0, first step the fault acted in or 0, that step's comparison rows)``.
    """
    parity: ParityConfig = setup.config.parity
    seed, forward_seed = int(setup.config.seed), setup.config.forward_seed
    rtol, atol = setup.tolerance()
    switch = Switch(on=False)
    twins = {"plain": setup.build(False), "faulty": setup.build(True)}
    optimizers = {
        name: instantiate(parity.optimizer, params=[p for p in m.parameters() if p.requires_grad])
        for name, m in twins.items()
    }
    generators = {name: torch.Generator().manual_seed(seed) for name in twins}
    rows: list[Row] = []
    with shifted_inputs(modules_of(twins["faulty"], base.region.hook_points), 1.0, seed, switch):
        for step in range(int(parity.steps)):
            switch.on = step + 1 >= k
            snaps = {}
            for name, model in twins.items():
                x, y = batch_to(setup.task.make_batch(generators[name], parity.batch_size), setup.device, setup.dtype)
                optimizers[name].zero_grad(set_to_none=True)
                with seeded(None if forward_seed is None else step_seed(forward_seed, seed, step)):
                    loss = setup.task.loss(call_model(model, x), y)
                    loss.backward()
                    rng = fingerprint()
                optimizers[name].step()
                snaps[name] = take(model, optimizers[name], rng, loss, clone=False)
            ignore = setup.config.state.ignore_attributes
            rows = snapshot_rows(snaps["plain"], snaps["faulty"], None, rtol, atol, ignore)
            acted = step + 1 if switch.acted else 0
            if any(r.status == Status.FAIL for r in rows):
                return step + 1, acted, rows
            if acted:
                return 0, acted, rows
    return 0, 0, rows


def _blind_said(base: Baseline, rows: list[Row], step: int) -> str:
    """Why trajectory parity did not fail at ``step``, the step the fault acted in."""
    if not any(not r.extra.get("bitwise_equal", True) for r in rows if r.role != Role.RNG):
        return unused_said(base.region.path, base.region_grad, "parameter or optimizer state")
    top = worst(rows)
    if top is None:
        return f"nothing was compared after step {step}"
    return (
        f"after step {step} the largest move was in {top.item}, {top.value:.3g} (it used "
        f"{top.extra['tolerance_used']:.2g} of its tolerance {tolerance_said(top)}): the tolerance is too wide for "
        "how far one step moves the parameters; lower parity.atol and parity.rtol"
    )
