"""The detector controls judged on the fixed batch, as gradient and state parity judge it: the activation
fault, the RNG fault and the lost gradient (gradient parity), the changed buffer (state parity)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from torch import nn

from reportgen.checks.controls.baseline import Baseline, buffer_rows, faulty_run, grad_rows
from reportgen.checks.controls.faults import bumped_buffer, other_rng, shifted_inputs, zeroed_inputs
from reportgen.checks.controls.region import buffer_of, modules_of
from reportgen.checks.controls.rows import (
    ACTIVATION,
    LOST,
    RNG,
    STATE,
    control_row,
    first_failing,
    grads_blind_said,
    inputs_not_floating,
    lost_said,
    named,
    not_needed,
    stated_row,
    tolerance_said,
    where_said,
    worst,
)
from reportgen.config import GRADIENT_PARITY, STATE_PARITY
from reportgen.results import Row, Status
from reportgen.twins.setup import Setup

#: Added to ``forward_seed`` for the generators a region draws from when the RNG control replays none.
OTHER_SEED = 7919


def gradient_control(
    setup: Setup, base: Baseline, fault: str, inject: Callable[[nn.Module], AbstractContextManager], said: str
) -> Row:
    """One fault gradient parity must catch: some parameter gradient of the faulty twin outside tolerance.

    Args:
        fault: the control's name (row item).
        inject: ``fn(recompute twin) -> context manager`` that installs the fault on it.
        said: what the fault was, for the detail.
    """
    region, size = base.region.path, base.size_said if fault == ACTIVATION else ""
    if base.grads_fail:
        return not_needed(fault, GRADIENT_PARITY, base.grads_fail)
    ran = faulty_run(setup, inject)
    if isinstance(ran, str):
        return control_row(
            fault,
            True,
            GRADIENT_PARITY,
            f"{said}: the faulty twin raised {ran}; gradient parity states that as an ERROR",
            size=size,
            caught_by="exception",
            extra={"region": region},
        )
    rows = grad_rows(setup, base.plain.out, ran.out)
    became_of = lambda r: lost_said(ran.out.grads.get(r.item.removesuffix(".grad")))  # noqa: E731
    lost = [r for r in rows if r.status == Status.FAIL and became_of(r) != "changed"] if fault == LOST else []
    failed = lost[0] if lost else first_failing(rows)
    if failed is not None:
        name = failed.item.removesuffix(".grad")
        became = became_of(failed) if fault == LOST else ""
        return control_row(
            fault,
            True,
            GRADIENT_PARITY,
            f"{said}: gradient parity fails {failed.item}"
            + (f" (the gradient became {became})" if became else f" ({failed.detail})")
            + f", {where_said(name, region)}; {sum(r.status == Status.FAIL for r in rows)} of {len(rows)} "
            "gradients fail",
            size=size,
            caught_by=failed.item,
            extra={"region": region, **({"share": base.share} if fault == ACTIVATION else {})},
        )
    moved = any(not r.extra.get("bitwise_equal", True) for r in rows)
    capped = fault == ACTIVATION and base.share >= 1.0
    why = grads_blind_said(region, base.region_grad, base.model_grad, rows, moved, capped)
    return control_row(
        fault,
        False,
        GRADIENT_PARITY,
        f"{said}: gradient parity is blind to it: {why}",
        size=size,
        extra={"region": region},
    )


def activation(setup: Setup, base: Baseline) -> Row:
    """Control 1: the region recomputes from inputs moved by ``controls.size`` tolerance units."""
    if not base.region.floating_inputs:
        return inputs_not_floating(ACTIVATION, base.region)
    seed = int(setup.config.seed)
    said = f"region {named(base.region.path)} recomputed from its activation moved by {base.size_said}"
    return gradient_control(
        setup,
        base,
        ACTIVATION,
        lambda twin: shifted_inputs(modules_of(twin, base.region.hook_points), base.share, seed),
        said,
    )


def rng_control(setup: Setup, base: Baseline) -> Row:
    """Control 2: the region draws from other generator states while it recomputes (where it draws)."""
    region = base.region
    if not region.draws:
        return stated_row(
            RNG,
            GRADIENT_PARITY,
            f"not applicable: no random draws in the recomputed region {named(region.path)} (every generator's state "
            "is the same before and after its forward)",
        )
    other = int(setup.config.forward_seed or 0) + OTHER_SEED
    said = (
        f"region {named(region.path)} draws from {', '.join(region.draws)} in its forward; while it recomputed it drew from "
        f"generators seeded {other} instead of the replayed states"
    )
    return gradient_control(setup, base, RNG, lambda twin: other_rng(modules_of(twin, region.hook_points), other), said)


def lost(setup: Setup, base: Baseline) -> Row:
    """Control 4: the region recomputes from zeros that carry no gradient."""
    if not base.region.floating_inputs:
        return inputs_not_floating(LOST, base.region)
    said = f"region {named(base.region.path)} recomputed from its activation times zero"
    return gradient_control(
        setup, base, LOST, lambda twin: zeroed_inputs(modules_of(twin, base.region.hook_points)), said
    )


def state(setup: Setup, base: Baseline) -> Row:
    """Control 3: a buffer of the region grows by 1 when the region recomputes; state parity must fail."""
    region = base.region
    buffer = region.buffer
    if buffer is None:
        return stated_row(
            STATE, STATE_PARITY, f"not applicable: the recomputed region {named(region.path)} has no buffer"
        )
    if base.buffers_fail:
        return not_needed(STATE, STATE_PARITY, base.buffers_fail)
    said = f"buffer {buffer} grew by 1 when region {named(region.path)} recomputed"
    ran = faulty_run(
        setup,
        lambda twin: bumped_buffer(modules_of(twin, region.hook_points), buffer_of(twin, buffer)),
    )
    if isinstance(ran, str):
        return control_row(
            STATE, True, STATE_PARITY, f"{said}: the faulty twin raised {ran}", size="1", caught_by="exception"
        )
    rows = buffer_rows(setup, base.plain, ran)
    failed = first_failing(rows)
    if failed is not None:
        return control_row(
            STATE,
            True,
            STATE_PARITY,
            f"{said}: state parity fails {failed.item} ({failed.detail})",
            size="1",
            caught_by=failed.item,
            extra={"region": region.path},
        )
    top = worst(rows)
    value = base.plain.buffers[buffer]
    scale = float(value.abs().max()) if value.numel() else 0.0
    moved = any(not r.extra.get("bitwise_equal", True) for r in rows)
    why = (
        f"the change stays within state parity's tolerance ({tolerance_said(top)} at |{buffer}| up to {scale:.3g}): "
        "lower parity.atol and parity.rtol"
        if top is not None and moved
        else f"no buffer moved: the fault could not act on {buffer} here"
    )
    return control_row(
        STATE,
        False,
        STATE_PARITY,
        f"{said}: state parity is blind to it: {why}",
        size="1",
        extra={"region": region.path},
    )
