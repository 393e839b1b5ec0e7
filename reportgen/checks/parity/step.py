"""One-optimizer-step parity (parameters, optimizer state) and state parity (buffers, plain
Python attributes of modules, every random generator's state, a module's or the task's own too), with the A/A
control: a second plain twin (a fresh copy of the same build) takes the same step. When some parameter,
optimizer-state or buffer item misses tolerance while every gradient is within it, a rounding
twin (reportgen/rounding.py) takes the step too and those items are judged against its envelope."""

from __future__ import annotations

import functools

from reportgen.checks.base import Check, Section
from reportgen.checks.base.run import Run
from reportgen.config import STATE_PARITY, STEP_PARITY, ParityConfig
from reportgen.results import Role, Row
from reportgen.results.raised import raised_for_lack_of_grad, run_twin, tagged_input_grad, twin_column
from reportgen.results.rounding import GradientNudge, grads_at_rounding_level
from reportgen.results.rows import ROUNDING_NOTE, aa_row
from reportgen.structure import has_floating
from reportgen.twins.forward import forward_backward
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import (
    Snapshot,
    aa_columns,
    outside_tolerance,
    snapshot_rows,
    take,
    with_aa,
    with_envelope,
)
from reportgen.twins.template import on_host
from reportgen.twins.twin import Twin


def one_step(twin: Twin, setup: Setup, input_grad: bool = False, nudge: GradientNudge | None = None) -> Snapshot:
    """Forward and backward of a fresh ``twin`` on the fixed batch (the parity function, generator states read right
    after backward), then its one optimizer step (``parity.optimizer``, or the task's own step's); snapshot
    everything (gradients as backward left them). ``nudge``: the rounding twin's gradient noise, applied right
    before the task's ``before_step`` and the step."""
    changes_grads = nudge is not None or twin.training_step.changes_grads
    out = forward_backward(
        twin, setup.batch, setup.config.forward_seed, input_grad, clone_grads=changes_grads
    )  # the twin is discarded after the step: its own gradients are the snapshot's unless the step changes them
    twin.apply(nudge)
    return take(twin.model, twin.optimizer, out.rng, out.loss, out.grads, clone=False, task=setup.task)


def step_and_state_parity(run: Run) -> list[Row]:
    """Run one optimizer step on fresh twins; compare what the step and the forward changed.

    Returns:
        ``optimizer-step parity`` rows (each parameter, each optimizer-state tensor) and
        ``state parity`` rows (each buffer, each plain attribute, each RNG state; an RNG state
        is compared bitwise: any difference means later random draws differ).
    """
    setup = run.setup
    rows = _compare_step(setup, input_grad=False)
    if raised_for_lack_of_grad(rows) and has_floating(setup.batch[0]):
        rows += [tagged_input_grad(r) for r in _compare_step(setup, input_grad=True)]
    return rows


def _one_twin(setup: Setup, recompute: bool, input_grad: bool) -> Snapshot:
    """:func:`one_step` on a fresh twin (which puts the task's own generators back as built: each twin starts alike)."""
    return one_step(setup.twin(recompute), setup, input_grad)


def _compare_step(setup: Setup, input_grad: bool) -> list[Row]:
    """Plain, A/A and recompute twins one after another; the A/A twin is compared and dropped before
    the recompute twin is built, so at most two training states are resident."""
    snaps: dict[str, Snapshot] = {}
    aa: dict[str, dict] = {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        snaps[name], rows = run_twin(
            STEP_PARITY, "plain" if name == "aa" else name, functools.partial(_one_twin, setup, recompute, input_grad)
        )
        if rows:  # state parity compares the same snapshots: it did not run either, and says whose fault
            stopped = Row.not_run(STATE_PARITY, f"not run, as optimizer-step parity: {rows[0].detail}", item=name)
            stopped.extra.update(twin_column(name))
            return rows + [stopped]
        if name == "plain":
            snaps["plain"] = on_host(snaps["plain"])  # kept while two more twins run: never on the device
        if name == "aa":
            aa = aa_columns(snaps["plain"], snaps.pop("aa"), *setup.tolerance())
    out = with_aa(
        snapshot_rows(
            snaps["plain"], snaps["recompute"], None, *setup.tolerance(), setup.config.state.ignore_attributes
        ),
        aa,
    )
    out = _rounding(setup, input_grad, snaps, out)
    return out + [aa_row(check, [r for r in out if r.check == check]) for check in (STEP_PARITY, STATE_PARITY)]


def _rounding(setup: Setup, input_grad: bool, snaps: dict[str, Snapshot], rows: list[Row]) -> list[Row]:
    """Judge the floating-state rows against the rounding twin's envelope, when it applies:
    ``parity.rounding_envelope`` on, some such row outside tolerance, and every recompute
    gradient within tolerance (the premise of the envelope). The rounding twin raising is an
    ERROR row; the other rows keep their tolerance verdicts."""
    parity: ParityConfig = setup.config.parity
    if not parity.rounding_envelope or not outside_tolerance(rows):
        return rows
    rtol, atol = setup.tolerance()
    if not grads_at_rounding_level(
        snaps["plain"].grads, snaps["recompute"].grads, None, rtol, atol, parity.rounding_factor
    ):
        return rows
    nudge = GradientNudge(rtol, atol, setup.config.seed)
    rounding, errors = run_twin(
        STEP_PARITY, "rounding twin", lambda: one_step(setup.twin(False), setup, input_grad, nudge)
    )
    return rows + errors if errors else with_envelope(rows, snaps["plain"], rounding, parity.rounding_factor)


CHECK = Check(
    step_and_state_parity,
    (
        Section(
            STEP_PARITY,
            "One step of the configured optimizer on each twin: parameters and optimizer state after it. "
            + ROUNDING_NOTE,
            roles=(Role.PARAM, Role.OPTIMIZER_STATE, Role.AA),
        ),
        Section(
            STATE_PARITY,
            "Buffers, plain Python attributes of modules, and the state of every random generator "
            "(torch, Python random, NumPy) after backward and of every torch.Generator a module or the task "
            "holds after the step; floating buffers may be judged against the rounding envelope, generator "
            "states and attributes must match exactly.",
            roles=(Role.BUFFER, Role.ATTRIBUTE, Role.RNG, Role.IGNORED, Role.AA),
        ),
    ),
)
