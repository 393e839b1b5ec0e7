"""Detector controls: faults injected inside one recompute region while it recomputes, each of which the check
that exists for it must catch on this model at these tolerances (docs/verdict.md, "the detector controls")."""

from __future__ import annotations

import time
from collections.abc import Callable

from reportgen.checks.base import Check, Section
from reportgen.checks.base.run import Run
from reportgen.checks.controls.fixed_batch import (
    Baseline,
    baseline,
    lost,
    region_row,
    rng_control,
    saving,
    stale,
    state,
)
from reportgen.checks.controls.later import later
from reportgen.checks.controls.limit import detection_limit, not_stated
from reportgen.checks.controls.rows import (
    FAULTS,
    LATER,
    LOST,
    RNG,
    SAVING,
    STALE,
    STATE,
    control_row,
    stated_row,
    uncovered_rows,
)
from reportgen.config import CONTROLS
from reportgen.results import Role, Row, Status
from reportgen.results.raised import exception_message
from reportgen.twins.setup import Setup


def timed(fault: str, control: Callable[[], Row]) -> Row:
    """``control()`` with its wall time in ``seconds``; a control that raises (reportgen's own failure, not
    a twin's) is a row with no value, so it is INCONCLUSIVE: nothing shows the check can see the fault."""
    start = time.perf_counter()
    try:
        row = control()
    except Exception as exc:  # noqa: BLE001 - failures are data
        row = control_row(
            fault, None, f"the control could not run: {type(exc).__name__}: {exception_message(exc)}", size=""
        )
    row.seconds = time.perf_counter() - start
    return row


def limited(setup: Setup, base: Baseline | str) -> list[Row]:
    """The detection limit's rows (:func:`reportgen.checks.controls.limit.detection_limit`); a search that raises
    (reportgen's own failure) is one ERROR row saying so, never a limit."""
    try:
        return detection_limit(setup, base)
    except Exception as exc:  # noqa: BLE001 - failures are data
        return [not_stated(f"the search could not run: {type(exc).__name__}: {exception_message(exc)}", Status.ERROR)]


def detector_controls(run: Run) -> list[Row]:
    """Inject each fault inside one recompute region while it recomputes, and see whether the check that
    must catch it does.

    Returns:
        Rows of check ``detector controls``: an INFO row naming the region and where the faults act; one
        row per fault (:data:`FAULTS`), judged ``caught >= 1`` (INCONCLUSIVE when missed; NaN when the
        control raised) or INFO when it does not apply or is not needed; an INFO row with the controls'
        total time (s); the detection limit's probes and its row
        (:func:`reportgen.checks.controls.limit.detection_limit`).
    """
    setup = run.setup
    start = time.perf_counter()
    observed = setup.observed or []
    base = (
        baseline(setup, observed)
        if observed
        else "not run: no module was observed recomputing, so there is no region to inject into"
    )
    if isinstance(base, str):
        rows, limit = [stated_row(f, base) for f in FAULTS], limited(setup, base)
    else:
        fixed_batch = {
            STALE: lambda: stale(setup, base),
            RNG: lambda: rng_control(setup, base),
            STATE: lambda: state(setup, base),
            LOST: lambda: lost(setup, base),
        }
        rows = [region_row(base, len(observed)), *(timed(fault, control) for fault, control in fixed_batch.items())]
        limit = limited(setup, base)
        base.drop_plain()  # the later-step control trains two twins of its own: no third state beside them
        rows += [timed(LATER, lambda: later(setup, base)), timed(SAVING, lambda: saving(setup))]
        rows += uncovered_rows(rows, setup.config.verdict.required)  # without a baseline the checks say why
    rows += limit
    seconds = time.perf_counter() - start
    return rows + [
        Row.fact(
            CONTROLS,
            "total time",
            Role.NOTE,
            f"the detector controls took {seconds:.2f} s in all (baseline twins, every fault, the later-step "
            "trajectory, the saved-activation counts and the detection limit's probes)",
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
            roles=(Role.CONTROL, Role.NOTE, Role.DETECTION_LIMIT, Role.LIMIT_PROBE),
        ),
    ),
    config="controls",
)
