"""Detector controls (issue 35): every report shows that its checks can see a recompute fault on this
model, at these tolerances.

A PASS says no check saw a difference; it does not say a check could have seen one. Here faults are
injected inside one recompute region, only while it recomputes (:mod:`reportgen.checks.controls.faults`),
so each travels through the twin's own backward like a real recompute bug, and each must be caught by
the check that exists for it, judged exactly as that check judges (the same row builders and
tolerances):

1. **recomputed activation off** — the region recomputes from inputs moved by ``controls.size``
   tolerance units; gradient parity must fail some parameter gradient.
2. **RNG not replayed** — the region draws from other generator states while it recomputes; gradient
   parity must fail. Applies only where the region's forward was seen drawing random numbers.
3. **state changed by recomputation** — a buffer of the region grows by 1 when it recomputes; state
   parity (buffers after the step) must fail. Applies only to a region with a buffer.
4. **gradient lost** — the region recomputes from zeros that carry no gradient; gradient parity must fail.
5. **fault from a later step** — fault 1 (at 100 %) switched on from step k = 2; trajectory parity must
   first fail at step k, not before.
6. **memory saving without recompute** — the recompute twin with its recompute turned off; its saving of
   saved activations must miss ``memory.negligible_saving_share``.

The region is the observed one (``setup.observed``) whose parameters get the largest gradient. A fault
that applies and is not caught makes the claim INCONCLUSIVE (exit 3); its row says which check is blind
and why (a tolerance too wide for the gradients, a region the loss does not depend on). A control whose
check already fails without any fault is not needed (INFO): a failure needs no control.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from reportgen.checks.base import Check, Section
from reportgen.checks.controls.baseline import baseline, region_row
from reportgen.checks.controls.fixed_batch import activation, lost, rng_control, state
from reportgen.checks.controls.later import later
from reportgen.checks.controls.rows import (
    ACTIVATION,
    FAULTS,
    LATER,
    LOST,
    RNG,
    SAVING,
    STATE,
    control_row,
    stated_row,
)
from reportgen.checks.controls.saving import saving
from reportgen.config import CONTROLS
from reportgen.results import Role, Row
from reportgen.results.rows import exception_message
from reportgen.twins.setup import Setup


def timed(fault: str, control: Callable[[], Row]) -> Row:
    """``control()`` with its wall time in ``seconds``; a control that raises (reportgen's own failure, not
    a twin's) is a row with no value, so it is INCONCLUSIVE: nothing shows the check can see the fault."""
    start = time.perf_counter()
    try:
        row = control()
    except Exception as exc:  # noqa: BLE001 - failures are data
        row = control_row(
            fault,
            None,
            FAULTS[fault],
            f"the control could not run: {type(exc).__name__}: {exception_message(exc)}",
            size="",
        )
    row.seconds = time.perf_counter() - start
    return row


def detector_controls(setup: Setup) -> list[Row]:
    """Inject each fault inside one recompute region while it recomputes, and see whether the check that
    must catch it does.

    Returns:
        Rows of check ``detector controls``: an INFO row naming the region and where the faults act; one
        row per fault (:data:`FAULTS`), judged ``caught >= 1`` (INCONCLUSIVE when missed; NaN when the
        control raised) or INFO when it does not apply or is not needed; an INFO row with the controls'
        total time (s).
    """
    start = time.perf_counter()
    if not setup.observed:
        said = "not run: no module was observed recomputing, so there is no region to inject into"
        rows = [stated_row(f, c, said) for f, c in FAULTS.items()]
    else:
        base, rows = baseline(setup)
        if base is not None:
            rows = [region_row(base, list(setup.observed))]
            controls = {
                ACTIVATION: lambda: activation(setup, base),
                RNG: lambda: rng_control(setup, base),
                STATE: lambda: state(setup, base),
                LOST: lambda: lost(setup, base),
                LATER: lambda: later(setup, base),
                SAVING: lambda: saving(setup),
            }
            rows += [timed(fault, control) for fault, control in controls.items()]
    seconds = time.perf_counter() - start
    return rows + [
        Row.fact(
            CONTROLS,
            "total time",
            Role.NOTE,
            f"the detector controls took {seconds:.2f} s in all (baseline twins, every fault, the later-step "
            "trajectory and the saved-activation counts)",
            metric="seconds",
            value=seconds,
            unit="s",
            seconds=seconds,
        )
    ]


CHECK = Check(
    detector_controls,
    (
        Section(
            CONTROLS,
            "Faults injected inside one recompute region, only while it recomputes, each of which the check named "
            "must catch on this model at these tolerances; a fault that is not caught makes the claim "
            "INCONCLUSIVE, since that check's PASS could not have seen it.",
            template="sections/detector-controls.html.j2",
            required=False,
            roles=(Role.CONTROL, Role.NOTE),
        ),
    ),
    config="controls",
)
