"""A failing check no diagnosis rule explains: name its first differing tensor and where to start
(:func:`reportgen.report.diagnose.diagnose`'s fallback)."""

from __future__ import annotations

from reportgen.checks import roles_of
from reportgen.results import Kind, Row, Status

#: Statuses a diagnosis explains.
BAD = (Status.FAIL, Status.ERROR, Status.INCONCLUSIVE)


def unexplained(check: str, rows: list[Row]) -> tuple[str, str]:
    """``(cause, fix)`` when no rule matches: both name the first differing tensor of ``check``'s rows
    (in the check's order: loss, outputs, gradients; a row whose role is of kind ``PARITY`` among those the
    registered checks declare, ``reportgen.checks.roles_of``) and the check that saw it, else its first bad row."""
    bad = [r for r in rows if r.status in BAD]
    compared = roles_of(Kind.PARITY)
    first = next((r for r in bad if r.role in compared), bad[0])
    said = first.detail.split("; ")[0][:160]
    what = "tensor" if first.role in compared else "failing row"
    cause = f"no known pattern matches these rows; the first differing {what} is {first.item} ({said})"
    fix = (
        f"start from {first.item}, which {check} saw differ first: find what the recomputed region computes "
        "differently for it (state read or written in the forward, randomness outside torch's generator, a "
        "custom autograd.Function); the rows below name every tensor and both values"
    )
    return cause, fix
