"""A failing check no diagnosis rule explains: name its first differing tensor and where to start
(:func:`reportgen.report.diagnose.diagnose`'s fallback)."""

from __future__ import annotations

from reportgen.results import Role, Row, Status

#: Statuses a diagnosis explains.
BAD = (Status.FAIL, Status.ERROR, Status.INCONCLUSIVE)

#: Roles of rows that compare one tensor (or value) between the twins.
TENSOR_ROLES = (
    Role.LOSS,
    Role.OUTPUT,
    Role.PARAM_GRAD,
    Role.INPUT_GRAD,
    Role.PARAM,
    Role.OPTIMIZER_STATE,
    Role.BUFFER,
    Role.ATTRIBUTE,
    Role.RNG,
    Role.RETAINED_GRAD,
    Role.OUTPUT_OTHER,
)


def unexplained(check: str, rows: list[Row]) -> tuple[str, str]:
    """``(cause, fix)`` when no rule matches: both name the first differing tensor of ``check``'s rows
    (in the check's order: loss, outputs, gradients) and the check that saw it, else its first bad row."""
    bad = [r for r in rows if r.status in BAD]
    first = next((r for r in bad if r.role in TENSOR_ROLES), bad[0])
    said = first.detail.split("; ")[0][:160]
    what = "tensor" if first.role in TENSOR_ROLES else "failing row"
    cause = f"no known pattern matches these rows; the first differing {what} is {first.item} ({said})"
    fix = (
        f"start from {first.item}, which {check} saw differ first: find what the recomputed region computes "
        "differently for it (state read or written in the forward, randomness outside torch's generator, a "
        "custom autograd.Function); the rows below name every tensor and both values"
    )
    return cause, fix
