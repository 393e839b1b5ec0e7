"""The rows of the detector controls, and the sentences that say why a check was blind and what to change."""

from __future__ import annotations

import math

from torch import Tensor

from reportgen.checks.controls.faults import Region
from reportgen.config import CONTROLS, GRADIENT_PARITY, MEMORY, STATE_PARITY, TRAJECTORY
from reportgen.results import Role, Row, Status

STALE = "stale input"
RNG = "RNG not replayed"
STATE = "state changed by recomputation"
LOST = "gradient lost"
LATER = "fault from a later step"
SAVING = "memory saving without recompute"
#: Every control, in row order, with the check that must catch it.
FAULTS = {
    STALE: GRADIENT_PARITY,
    RNG: GRADIENT_PARITY,
    STATE: STATE_PARITY,
    LOST: GRADIENT_PARITY,
    LATER: TRAJECTORY,
    SAVING: MEMORY,
}


#: The size each fault is stated with (none depends on the tolerance it must be caught at).
SIZES = {STALE: "another example", LOST: "all of it", STATE: "1", LATER: "another example", SAVING: "recompute off"}


def control_row(
    fault: str,
    caught: bool | None,
    detail: str,
    *,
    size: str | None = None,
    caught_by: str = "",
    extra: dict | None = None,
) -> Row:
    """The row of one applied control: ``caught`` (1.0 caught, 0.0 not, NaN when the control itself
    could not run) judged ``>= 1``, else INCONCLUSIVE.

    Args:
        fault: the row's ``item``, a key of :data:`FAULTS` (which names the check that must catch it).
        caught: whether that check saw the fault; None = the control raised before it could tell.
        detail: one sentence: the fault, its size, and who caught it or why the check is blind.
        size: the fault's size for people; None = the fault's own (:data:`SIZES`, "" for one without a size).
        caught_by: the item of the failing row that caught it ("" when not caught).
        extra: further columns (``region``, ``step``, ...).
    """
    return Row.measured(
        CONTROLS,
        fault,
        "caught",
        math.nan if caught is None else float(caught),
        "",
        comparator=">=",
        threshold_value=1.0,
        threshold=f"caught by {FAULTS[fault]}",
        on_miss=Status.INCONCLUSIVE,
        role=Role.CONTROL,
        detail=detail,
        extra={
            "fault": fault,
            "size": SIZES.get(fault, "") if size is None else size,
            "must_catch": FAULTS[fault],
            "caught_by": caught_by,
            **(extra or {}),
        },
    )


def stated_row(fault: str, detail: str, extra: dict | None = None) -> Row:
    """An INFO row for a control that was not applied: it does not apply to this model ("not applicable:
    <observed reason>"), it is not needed (the check already fails without a fault), or the baseline broke."""
    return Row.fact(
        CONTROLS,
        fault,
        Role.CONTROL,
        detail,
        metric="caught",
        extra={"fault": fault, "size": "", "must_catch": FAULTS[fault], "caught_by": "", **(extra or {})},
    )


def worst(rows: list[Row]) -> Row | None:
    """The row that uses the largest share of its tolerance (column ``tolerance_used``), else None."""
    used = [r for r in rows if r.extra.get("tolerance_used") is not None]
    return max(used, key=lambda r: r.extra["tolerance_used"], default=None)


def moved(rows: list[Row]) -> bool:
    """True when some compared value of ``rows`` differs at all (column ``bitwise_equal``)."""
    return any(not r.extra.get("bitwise_equal", True) for r in rows)


def tolerance_said(row: Row) -> str:
    """``"atol=1e-05 rtol=1.3e-06"``: the tolerance ``row`` was judged at."""
    return f"atol={row.extra.get('atol', math.nan):g} rtol={row.extra.get('rtol', math.nan):g}"


def named(path: str) -> str:
    """A module path for a sentence: ``"blocks.0"`` in quotes (a bare ``0`` reads as a number), ``(root)`` for ``""``."""
    return f'"{path}"' if path else "(root)"


def where_said(name: str, region: str) -> str:
    """Where the parameter ``name`` lies relative to ``region``: inside it, or upstream (its gradient comes
    through the region's input gradient)."""
    if region == "" or name.startswith(region + "."):
        return f"a parameter of region {named(region)}"
    return f"upstream of region {named(region)} (its gradient flows back through the region's input)"


def lost_said(grad: Tensor | None) -> str:
    """``"None"``, ``"all zero"`` or ``"changed"``: what a faulty twin's gradient became."""
    if grad is None:
        return "None"
    return "all zero" if not bool(grad.detach().ne(0).any()) else "changed"


def unused_said(region: str, region_grad: float, what: str) -> str:
    """Why a fault inside ``region`` moved nothing at all (no ``what``, e.g. "gradient", differs by a bit),
    and what to change."""
    dead = (
        f"the loss does not depend on region {named(region)}: its parameters' gradients are all 0 in the "
        "plain twin (its output is discarded or multiplied by zero)"
        if region_grad == 0
        else f"backward never reads what region {named(region)} recomputes"
    )
    return (
        f"no {what} moved at all: {dead}, so no recompute fault inside it can reach one. "
        f"Recompute a region the loss uses, or find out why the output of {named(region)} is not used"
    )


def grads_blind_said(region: str, region_grad: float, model_grad: float, rows: list[Row], moved_any: bool) -> str:
    """Why gradient parity did not catch a fault inside ``region``, and what to change.

    Args:
        region: the region's path.
        region_grad: ``max |grad|`` of the region's parameters in the plain twin (0 when it has none or
            the loss does not depend on them).
        model_grad: ``max |grad|`` of every parameter in the plain twin.
        rows: the faulty twin's parameter-gradient rows (judged at gradient parity's tolerance).
        moved_any: some gradient differs from the plain twin's at all (bitwise).
    """
    if model_grad == 0:
        return (
            "the plain twin's gradients are all 0, so no fault can move one: the loss does not depend on "
            "the parameters; check the task's loss"
        )
    if not moved_any:
        return unused_said(region, region_grad, "gradient")
    top = worst(rows)
    said = (
        f"the largest move was in {top.item}, {top.value:.3g} (it used {top.extra['tolerance_used']:.2g} of "
        f"its tolerance {tolerance_said(top)})"
        if top is not None
        else "no gradient left its tolerance"
    )
    return (
        f"{said}, while the largest gradient is {model_grad:.3g}"
        f": the tolerance is too wide for this model's gradients. Lower parity.atol well below the "
        f"gradients' scale ({model_grad:.3g}) and parity.rtol well below 1"
    )


def not_needed(fault: str, failing: list[str]) -> Row:
    """INFO: the check that must catch ``fault`` already fails without any fault (``failing`` items)."""
    listed = ", ".join(failing[:3]) + (f" and {len(failing) - 3} more" if len(failing) > 3 else "")
    return stated_row(
        fault, f"not needed: {FAULTS[fault]} already fails without any fault ({listed}); a failure needs no control"
    )


#: The parity checks every run must prove able to see a recompute fault (the memory control proves a measurement).
PARITY_CHECKS = (GRADIENT_PARITY, STATE_PARITY, TRAJECTORY)


def covered(row: Row) -> bool:
    """True when a control row shows its check can see a fault (judged, caught or not) or needs no proof (the check
    already fails without a fault); False for a control that did not apply or could not run."""
    judged = row.metric == "caught" and row.value is not None and not math.isnan(row.value)
    return judged or row.detail.startswith("not needed")


def uncovered_rows(rows: list[Row], required: list[str] | None) -> list[Row]:
    """One INCONCLUSIVE row per required parity check (:data:`PARITY_CHECKS`; ``required`` None = all of them) that
    no control row covers (:func:`covered`): nothing shows that check could see a recompute fault on this model.

    Returns:
        Rows item ``"<check> has no control"``, metric ``applicable_controls`` = 0 judged ``>= 1``, role CONTROL (so
        they stand between the claim and PASS, never above a FAIL); empty when every required check is covered.
    """
    out = []
    for check in PARITY_CHECKS:
        if required is not None and check not in required:
            continue
        mine = [r for r in rows if r.role == Role.CONTROL and r.extra.get("must_catch") == check]
        if any(covered(r) for r in mine):
            continue
        why = "; ".join(f"{r.item}: {r.detail}" for r in mine) or "it has no control"
        out.append(
            Row.measured(
                CONTROLS,
                f"{check} has no control",
                "applicable_controls",
                0.0,
                "controls",
                comparator=">=",
                threshold_value=1.0,
                threshold=f"at least one control {check} must catch",
                on_miss=Status.INCONCLUSIVE,
                role=Role.CONTROL,
                detail=(
                    f"no control applies to {check} on this model, so nothing shows it could see a recompute fault "
                    f"here ({why}); its PASS is unproven"
                ),
                extra={"fault": "", "size": "", "must_catch": check, "caught_by": ""},
            )
        )
    return out


def inputs_not_floating(fault: str, region: Region) -> Row:
    """INFO: a fault on the region's inputs cannot act: none of its modules ran again in backward (e.g.
    ``torch.compile`` recomputes inside its own backward graph, where no module hook runs), or they get no
    floating tensor (token ids only)."""
    why = (
        f"the modules of region {named(region.path)} that run again in backward ({', '.join(region.hook_points)}) "
        "get no floating tensor (token ids only)"
        if region.hook_points
        else f"no module of region {named(region.path)} ran again in backward where a hook can see it (e.g. "
        "torch.compile recomputes inside its own backward graph)"
    )
    return stated_row(fault, f"not applicable: {why}")
