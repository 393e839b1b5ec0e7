"""What every detector control compares against: one forward and backward of the plain twin and of an
observed, unfaulted recompute twin on the fixed batch (what gradient and state parity run), the region the
faults go into, and the activation fault's size."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from reportgen.checks.controls.region import Region, choose_region, largest_grad, observing
from reportgen.checks.controls.rows import FAULTS, named, stated_row
from reportgen.config import CONTROLS, ControlsConfig
from reportgen.results import Role, Row, Status
from reportgen.results.distance import tolerances
from reportgen.results.rows import exception_message, tensor_row
from reportgen.twins.forward import StepOutput, forward_backward
from reportgen.twins.recompute import plain_name
from reportgen.twins.setup import Setup
from reportgen.twins.template import on_host


@dataclass
class Ran:
    """One forward and backward of a twin on the fixed batch: what it returned, and its buffers after."""

    out: StepOutput
    buffers: dict[str, Tensor]


@dataclass
class Baseline:
    """What every control compares against, and what the unfaulted recompute twin already fails.

    Attributes:
        plain: the plain twin's run (kept on the host).
        region: the region the faults go into, observed in the unfaulted recompute twin.
        grads_fail: parameter-gradient items the unfaulted recompute twin already fails.
        buffers_fail: buffer items the unfaulted recompute twin already fails.
        region_grad, model_grad: ``max |grad|`` in the plain twin over the region's parameters, over all.
        share: the activation fault's relative size (1.0 = 100 % of each input).
        size_said: that size for people.
    """

    plain: Ran
    region: Region
    grads_fail: list[str] = field(default_factory=list)
    buffers_fail: list[str] = field(default_factory=list)
    region_grad: float = 0.0
    model_grad: float = 0.0
    share: float = 1.0
    size_said: str = ""


def run(setup: Setup, model: nn.Module) -> Ran:
    """:func:`reportgen.twins.forward.forward_backward` on the fixed batch (what gradient parity calls),
    and ``model``'s buffers after it (what state parity compares)."""
    out = forward_backward(model, setup.batch, setup.task.loss, setup.config.forward_seed)
    return Ran(out, {plain_name(n): b.detach().clone() for n, b in model.named_buffers()})


def grad_rows(setup: Setup, plain: StepOutput, other: StepOutput) -> list[Row]:
    """Gradient parity's parameter-gradient rows of ``other`` against ``plain``
    (:func:`reportgen.results.rows.tensor_row`, at ``setup.tolerance()`` resolved per tensor)."""
    rtol, atol = setup.tolerance()
    names = dict.fromkeys([*plain.grads, *other.grads])
    return [
        tensor_row(CONTROLS, f"{n}.grad", plain.grads.get(n), other.grads.get(n), rtol, atol, Role.PARAM_GRAD)
        for n in names
    ]


def buffer_rows(setup: Setup, plain: Ran, other: Ran) -> list[Row]:
    """State parity's buffer rows of ``other`` against ``plain`` (same builder and tolerances)."""
    rtol, atol = setup.tolerance()
    names = sorted(set(plain.buffers) | set(other.buffers))
    return [
        tensor_row(CONTROLS, f"buffer {n}", plain.buffers.get(n), other.buffers.get(n), rtol, atol, Role.BUFFER)
        for n in names
    ]


def fault_size(
    setup: Setup, region_grad: float, model_grad: float, grads: dict[str, Tensor | None]
) -> tuple[float, str]:
    """The activation fault's relative size: ``controls.size`` × the relative difference gradient parity
    accepts at the region's gradient scale, ``rtol + atol / max|grad|`` (the whole model's scale for a
    region without parameters), at most 1 (100 % of each input). Anchored to the gradients, not to the
    tolerance alone, so a tolerance wider than the gradients shows as a blind check.

    Returns:
        ``(share, sentence)``, e.g. ``(0.0016, "10 tolerance units: 0.16 % of each input (...)")``.
    """
    section: ControlsConfig = setup.config.controls
    dtype = next((g.dtype for g in grads.values() if g is not None), torch.float32)
    rt, at = tolerances(dtype, *setup.tolerance())
    scale = region_grad or model_grad
    relative = rt + at / scale if scale > 0 else float("inf")
    share = min(section.size * relative, 1.0)
    said = (
        f"{section.size:g} tolerance units, {share * 100:.3g} % of its size ({section.size:g} × (rtol {rt:g} + "
        f"atol {at:g} / max |grad| {scale:.3g}){', capped at 100 %' if share == 1.0 else ''})"
    )
    return share, said


def baseline(setup: Setup) -> tuple[Baseline | None, list[Row]]:
    """Run the plain twin and an observed, unfaulted recompute twin. Returns the baseline, or None and one
    INFO row per control when either twin raised (the other checks say so; nothing can be controlled)."""
    try:
        plain = run(setup, setup.build(False))
    except Exception as exc:  # noqa: BLE001 - the plain twin's failure is stated, the claim is judged elsewhere
        said = f"not run: the plain twin raised {type(exc).__name__}: {exception_message(exc)}"
        return None, [stated_row(f, c, said) for f, c in FAULTS.items()]
    plain = Ran(on_host(plain.out), {k: v.cpu() for k, v in plain.buffers.items()})
    path = choose_region(list(setup.observed or []), plain.out.grads)
    twin = setup.build(True)
    try:
        with observing(twin, path) as region:
            reference = run(setup, twin)
    except Exception as exc:  # noqa: BLE001 - gradient parity's ERROR row fails the claim already
        said = (
            f"not needed: the recompute twin raises without any fault ({type(exc).__name__}: "
            f"{exception_message(exc)}), which gradient parity states as an ERROR"
        )
        return None, [stated_row(f, c, said) for f, c in FAULTS.items()]
    base = Baseline(plain, region)
    base.grads_fail = [r.item for r in grad_rows(setup, plain.out, reference.out) if r.status == Status.FAIL]
    base.buffers_fail = [r.item for r in buffer_rows(setup, plain, reference) if r.status == Status.FAIL]
    base.region_grad = largest_grad(plain.out.grads, path)
    base.model_grad = largest_grad(plain.out.grads)
    base.share, base.size_said = fault_size(setup, base.region_grad, base.model_grad, plain.out.grads)
    return base, []


def region_row(base: Baseline, observed: list[str]) -> Row:
    """INFO: the region the faults go into, why it, and the modules a fault acts on."""
    region = base.region
    points = ", ".join(p or "(root)" for p in region.hook_points) or "none"
    return Row.fact(
        CONTROLS,
        "region",
        Role.NOTE,
        f"faults go into region {named(region.path)} ({len(observed)} region(s) observed recomputing), the one "
        f"whose parameters get the largest gradient (max |grad| {base.region_grad:.3g}); modules that run "
        f"again in backward, where a fault acts: {points}; random draws in its forward: "
        f"{', '.join(region.draws) or 'none'}; buffer: {region.buffer or 'none'}",
        metric="region",
        extra={"region": region.path, "hook_points": points},
    )


def faulty_run(setup: Setup, inject: Callable[[nn.Module], AbstractContextManager]) -> Ran | str:
    """A fresh recompute twin run with ``inject(twin)`` installed: its :class:`Ran`, or, when the twin
    raised, the exception said (gradient parity's ERROR row would catch it)."""
    twin = setup.build(True)
    with inject(twin):
        try:
            return run(setup, twin)
        except Exception as exc:  # noqa: BLE001 - a twin that raises is what an ERROR row catches
            return f"{type(exc).__name__}: {exception_message(exc)}"
