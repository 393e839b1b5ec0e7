"""The detector controls judged on the fixed batch, as gradient parity, state parity and the memory check judge
it, and the baseline every control compares against: one forward and backward of the plain twin and of an
observed, unfaulted recompute twin."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from reportgen.checks.controls.faults import (
    COUNTER,
    Region,
    buffer_of,
    bumped_buffer,
    bumped_counter,
    call_directly,
    choose_region,
    largest_grad,
    modules_of,
    observing,
    other_rng,
    stale_inputs,
    zeroed_inputs,
)
from reportgen.checks.controls.rows import (
    LOST,
    RNG,
    SAVING,
    STALE,
    STATE,
    control_row,
    grads_blind_said,
    inputs_not_floating,
    lost_said,
    moved,
    named,
    not_needed,
    stated_row,
    tolerance_said,
    where_said,
    worst,
)
from reportgen.checks.memory.rows import saved_rows
from reportgen.checks.parity.gradient import compare
from reportgen.config import CONTROLS, MemoryConfig
from reportgen.memory.saved import saved_activation_bytes
from reportgen.results import Role, Row, Status
from reportgen.results.raised import exception_message
from reportgen.twins.forward import StepOutput, forward_backward
from reportgen.twins.recompute import plain_name
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import Snapshot, module_attributes, snapshot_rows
from reportgen.twins.template import on_host
from reportgen.twins.twin import Twin

#: The seconds :func:`reportgen.checks.memory.rows.saved_rows` states beside each twin (the control times itself).
NO_SECONDS = {"plain": 0.0, "recompute": 0.0}
#: Added to ``forward_seed`` for the generators a region draws from when the RNG control replays none.
OTHER_SEED = 7919


@dataclass
class Ran:
    """One forward and backward of a twin on the fixed batch: what it returned, and its buffers and plain module
    attributes after (what state parity compares, :func:`reportgen.twins.snapshot.module_attributes`)."""

    out: StepOutput
    buffers: dict[str, Tensor]
    attributes: dict[str, Any]


@dataclass
class Baseline:
    """What every control compares against, and what the unfaulted recompute twin already fails.

    Attributes:
        plain: the plain twin's run (kept on the host).
        region: the region the faults go into, observed in the unfaulted recompute twin.
        grads_fail: parameter-gradient items the unfaulted recompute twin already fails.
        state_fail: buffer and attribute items the unfaulted recompute twin already fails.
        region_grad, model_grad: ``max |grad|`` in the plain twin over the region's parameters, over all.
    """

    plain: Ran
    region: Region
    grads_fail: list[str]
    state_fail: list[str]
    region_grad: float
    model_grad: float

    def drop_plain(self) -> None:
        """Free the plain run's gradients and buffers (a model's worth of bytes) once the fixed-batch controls and
        the detection limit have read them: the later-step control holds two training states of its own."""
        out = dataclasses.replace(self.plain.out, output={}, input_grad={}, grads={}, retained={})
        self.plain = Ran(out, {}, {})


def run(setup: Setup, twin: Twin) -> Ran:
    """:func:`reportgen.twins.forward.forward_backward` of ``twin`` on the fixed batch (what gradient parity calls),
    and its buffers after it (what state parity compares)."""
    out = forward_backward(twin, setup.batch, setup.config.forward_seed)
    buffers = {plain_name(n): b.detach().clone() for n, b in twin.model.named_buffers()}
    return Ran(out, buffers, module_attributes(twin.model))


def grad_rows(setup: Setup, plain: StepOutput, other: StepOutput) -> list[Row]:
    """Gradient parity's parameter-gradient rows of ``other`` against ``plain``, by gradient parity's own judge
    (:func:`reportgen.checks.parity.gradient.compare`, at ``setup.tolerance()``)."""
    return [r for r in compare(plain, other, *setup.tolerance()) if r.role == Role.PARAM_GRAD]


def state_rows(setup: Setup, plain: Ran, other: Ran) -> list[Row]:
    """State parity's buffer and attribute rows of ``other`` against ``plain``, by state parity's own judge
    (:func:`reportgen.twins.snapshot.snapshot_rows`, at ``setup.tolerance()``, ``state.ignore_attributes`` applied)."""
    mine, theirs = (Snapshot({}, {}, ran.buffers, ran.attributes, {}) for ran in (plain, other))
    rows = snapshot_rows(mine, theirs, None, *setup.tolerance(), setup.config.state.ignore_attributes)
    return [r for r in rows if r.role in (Role.BUFFER, Role.ATTRIBUTE, Role.IGNORED)]


def baseline(setup: Setup, observed: list[str]) -> Baseline | str:
    """Run the plain twin and an unfaulted recompute twin observed in the region chosen among ``observed``.
    Returns the baseline, or, when either twin raised, why no control runs (the other checks say so)."""
    try:
        plain = run(setup, setup.twin(False))
    except Exception as exc:  # noqa: BLE001 - the plain twin's failure is stated, the claim is judged elsewhere
        return f"not run: the plain twin raised {type(exc).__name__}: {exception_message(exc)}"
    plain = Ran(on_host(plain.out), {k: v.cpu() for k, v in plain.buffers.items()}, plain.attributes)
    path = choose_region(observed, plain.out.grads)
    twin = setup.twin(True)
    try:
        with observing(twin.model, path) as region:
            reference = run(setup, twin)
    except Exception as exc:  # noqa: BLE001 - gradient parity's ERROR row fails the claim already
        return (
            f"not needed: the recompute twin raises without any fault ({type(exc).__name__}: "
            f"{exception_message(exc)}), which gradient parity states as an ERROR"
        )
    region_grad, model_grad = largest_grad(plain.out.grads, path), largest_grad(plain.out.grads)
    return Baseline(
        plain,
        region,
        [r.item for r in grad_rows(setup, plain.out, reference.out) if r.status == Status.FAIL],
        [r.item for r in state_rows(setup, plain, reference) if r.status == Status.FAIL],
        region_grad,
        model_grad,
    )


def region_row(base: Baseline, observed: int) -> Row:
    """INFO: the region the faults go into (among ``observed`` regions), why it, and where a fault acts."""
    region = base.region
    points = ", ".join(p or "(root)" for p in region.hook_points) or "none"
    return Row.fact(
        CONTROLS,
        "region",
        Role.NOTE,
        f"faults go into region {named(region.path)} ({observed} region(s) observed recomputing), the one "
        f"whose parameters get the largest gradient (max |grad| {base.region_grad:.3g}); modules that run "
        f"again in backward, where a fault acts: {points}; random draws in its forward: "
        f"{', '.join(region.draws) or 'none'}; buffer: {region.buffer or 'none'}",
        metric="region",
        extra={"region": region.path, "hook_points": points},
    )


def faulty_run(setup: Setup, inject: Callable[[nn.Module], AbstractContextManager]) -> Ran | str:
    """A fresh recompute twin run with ``inject(twin)`` installed: its :class:`Ran`, or, when the twin
    raised, the exception said (gradient parity's ERROR row would catch it)."""
    twin = setup.twin(True)
    with inject(twin.model):
        try:
            return run(setup, twin)
        except Exception as exc:  # noqa: BLE001 - a twin that raises is what an ERROR row catches
            return f"{type(exc).__name__}: {exception_message(exc)}"


def gradient_control(
    setup: Setup, base: Baseline, fault: str, inject: Callable[[nn.Module], AbstractContextManager], said: str
) -> Row:
    """One fault gradient parity must catch: some parameter gradient of the faulty twin outside tolerance (the
    :data:`LOST` fault applies only where the region's inputs are floating).

    Args:
        fault: the control's name (row item).
        inject: ``fn(recompute twin) -> context manager`` that installs the fault on it.
        said: what the fault was, for the detail.
    """
    if fault == LOST and not base.region.floating_inputs:
        return inputs_not_floating(fault, base.region)
    if base.grads_fail:
        return not_needed(fault, base.grads_fail)
    region = base.region.path
    ran = faulty_run(setup, inject)
    if isinstance(ran, str):
        said = f"{said}: the faulty twin raised {ran}; gradient parity states that as an ERROR"
        return control_row(fault, True, said, caught_by="exception", extra={"region": region})
    rows = grad_rows(setup, base.plain.out, ran.out)
    failing = [r for r in rows if r.status == Status.FAIL]
    became = {r.item: lost_said(ran.out.grads.get(r.item.removesuffix(".grad"))) for r in failing if fault == LOST}
    failed = next(iter([r for r in failing if became.get(r.item, "changed") != "changed"] + failing), None)
    if failed is not None:
        how = f"the gradient became {became[failed.item]}" if fault == LOST else failed.detail
        return control_row(
            fault,
            True,
            f"{said}: gradient parity fails {failed.item} ({how}), "
            f"{where_said(failed.item.removesuffix('.grad'), region)}; {len(failing)} of {len(rows)} gradients fail",
            caught_by=failed.item,
            extra={"region": region},
        )
    why = grads_blind_said(region, base.region_grad, base.model_grad, rows, moved(rows))
    said = f"{said}: gradient parity is blind to it: {why}"
    return control_row(fault, False, said, extra={"region": region})


def stale(setup: Setup, base: Baseline) -> Row:
    """Control 1: the region recomputes from another example's input (its first tensor argument rolled by one
    along the batch), whatever the input's kind: a stale or reordered buffer read while recomputing."""
    region = base.region
    if not region.rollable_inputs:
        return stated_row(
            STALE,
            f"not applicable: every input of the recomputed region {named(region.path)} holds one entry along each "
            "dimension, so there is no other example to read",
        )
    said = f"region {named(region.path)} recomputed from another example's input (rolled by one along the batch)"
    return gradient_control(setup, base, STALE, lambda twin: stale_inputs(modules_of(twin, region.hook_points)), said)


def rng_control(setup: Setup, base: Baseline) -> Row:
    """Control 2: the region draws from other generator states while it recomputes (where it draws)."""
    region = base.region
    if not region.draws:
        return stated_row(
            RNG,
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
    said = f"region {named(base.region.path)} recomputed from its activation times zero"
    points = base.region.hook_points
    return gradient_control(setup, base, LOST, lambda twin: zeroed_inputs(modules_of(twin, points)), said)


def state(setup: Setup, base: Baseline) -> Row:
    """Control 3: state updated again when the region recomputes: its buffer grows by 1 (a running statistic), or,
    in a region without buffers, a counter attribute of its module does (a Python call counter); state parity must
    fail."""
    region, buffer = base.region, base.region.buffer
    if base.state_fail:
        return not_needed(STATE, base.state_fail)
    points = region.hook_points
    if buffer is not None:
        said = f"buffer {buffer} grew by 1 when region {named(region.path)} recomputed"
        ran = faulty_run(setup, lambda twin: bumped_buffer(modules_of(twin, points), buffer_of(twin, buffer)))
    else:
        said = f"a call counter of region {named(region.path)} ({COUNTER}) grew by 1 when it recomputed"
        ran = faulty_run(setup, lambda twin: bumped_counter(modules_of(twin, points)))
    if isinstance(ran, str):
        return control_row(STATE, True, f"{said}: the faulty twin raised {ran}", caught_by="exception")
    rows = state_rows(setup, base.plain, ran)
    failed = next((r for r in rows if r.status == Status.FAIL), None)
    if failed is not None:
        said = f"{said}: state parity fails {failed.item} ({failed.detail})"
        return control_row(STATE, True, said, caught_by=failed.item, extra={"region": region.path})
    said = f"{said}: state parity is blind to it: {_state_blind_said(rows, base, buffer)}"
    return control_row(STATE, False, said, extra={"region": region.path})


def _state_blind_said(rows: list[Row], base: Baseline, buffer: str | None) -> str:
    """Why state parity missed the state fault: the tolerance, an ignored attribute, or a fault that never acted."""
    ignored = [r.item for r in rows if r.role == Role.IGNORED and COUNTER in r.item]
    if buffer is None:
        if ignored:
            return f"{ignored[0]} is ignored by state.ignore_attributes, which hides every attribute it matches"
        return "the counter was never set: the region did not run again in backward"
    top = worst(rows)
    if top is None or not moved(rows):
        return f"no buffer moved: the fault could not act on {buffer} here"
    value = base.plain.buffers[buffer]
    scale = float(value.abs().max()) if value.numel() else 0.0
    return (
        f"the change stays within state parity's tolerance ({tolerance_said(top)} at |{buffer}| up to {scale:.3g}): "
        "lower parity.atol and parity.rtol"
    )


def saving(setup: Setup) -> Row:
    """Control 6: the recompute twin with its recompute turned off must show no saving of saved
    activations, so the memory check's saving threshold (``memory.negligible_saving_share``) must miss it."""
    section: MemoryConfig = setup.config.memory
    if not section.enabled:
        return stated_row(SAVING, "not applicable: memory.enabled=false, there is no memory claim")
    measure = functools.partial(
        saved_activation_bytes,
        batch=setup.batch,
        step=setup.training_step,
        forward_seed=setup.config.forward_seed,
        module_paths=[w.path for w in setup.wrapped],
    )
    plain = measure(setup.build(False))
    twin = setup.build(True)
    wrappers = [m for m in twin.modules() if isinstance(m, CheckpointWrapper)]
    for wrapper in wrappers:
        wrapper.checkpoint_fn = call_directly
    how = (
        f"the recompute twin with its {len(wrappers)} recompute wrapper(s) calling their modules directly"
        if wrappers
        else "the recompute twin with the model's switch off, which is the plain twin"
    )
    off = measure(twin if wrappers else setup.build(False))
    judged = next(r for r in saved_rows(setup, {"plain": plain, "recompute": off}, NO_SECONDS) if r.role == Role.SAVING)
    share, threshold = judged.value, section.negligible_saving_share
    said = (
        f"{how} keeps {off.total_bytes} B of saved activations against the plain twin's {plain.total_bytes} B "
        f"(saving share {share:.3g})"
    )
    if judged.status != Status.PASS:  # the memory check's own saving row misses it
        return control_row(
            SAVING,
            True,
            f"{said}: below memory.negligible_saving_share={threshold:g}, so the memory check states no saving "
            f"(and the peak verdict, memory.min_peak_saving_share={section.min_peak_saving_share:g}, misses too)",
            caught_by="saved activations (total)",
            extra={"saving_share": share},
        )
    why = (
        f"memory.negligible_saving_share={threshold:g} accepts a saving of {share:.3g}, even none: set it above 0"
        if threshold <= 0
        else f"a twin that recomputes nothing saves {share:.3g}: the saved-activation count is wrong for this model"
    )
    said = f"{said}: the memory check is blind to it: {why}"
    return control_row(SAVING, False, said, extra={"saving_share": share})
