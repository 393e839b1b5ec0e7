"""What a failing check's evidence shows when no diagnosis rule explains it (:func:`reportgen.report.diagnose.diagnose`'s
fallback), and the readers of evidence the rules share: torch's own words (:func:`quote`), a generator's name."""

from __future__ import annotations

import re

from reportgen.checks import roles_of
from reportgen.results import Kind, Role, Row, Status

#: Statuses a diagnosis explains.
BAD = (Status.FAIL, Status.ERROR, Status.INCONCLUSIVE)
#: Where an ERROR row says its exception was raised (``(at checkpoint.py:1234)``, results.raised.error_row): not quoted.
WHERE = re.compile(r" \(at [^()]*:\d+\)$")


def quote(row: Row) -> str:
    """``the plain twin on rank 1 raised: "<torch's first sentence>"`` from an ERROR row: its message's first
    sentence, without the file and line it was raised at or any traceback (a handled exception is one sentence)."""
    kind = row.extra.get("exception_type")
    marker = f"{kind}: " if kind and f"{kind}: " in row.detail else ": "  # the message starts after the type
    message = WHERE.sub("", row.detail.split("Traceback (most recent call last)")[0].strip()).split(marker, 1)[-1]
    first = message.split(". ")[0].strip().rstrip(".")[:300]
    twin, rank = row.extra.get("twin"), row.extra.get("rank")
    who = " ".join(x for x in (f"the {twin} twin" if twin else "", f"on rank {rank}" if rank is not None else "") if x)
    return f'{who or "a rank"} raised: "{first}"'


def generator(row: Row) -> str:
    """The generator a state-parity RNG row compares: ``torch.get_rng_state()`` (a global one: a call) or
    ``blocks.0._gen`` (a ``torch.Generator`` a module holds)."""
    return row.item.removeprefix("RNG ").split(" after ")[0]


def module_of(row: Row) -> str | None:
    """The module that holds the parameter (or buffer) of a gradient, parameter or buffer row; None for others (and
    for the root module's own)."""
    if row.role not in (Role.PARAM_GRAD, Role.PARAM, Role.BUFFER):
        return None
    name = re.sub(r"^(rank \d+: )?(param |buffer )?|(\.grad)?( \[input requires grad\])?$", "", row.item)
    return name.rpartition(".")[0] or None


def unexplained(check: str, group: list[Row], rows: list[Row]) -> tuple[str, str]:
    """``(cause, fix)`` when no rule matches: what the evidence shows, each part only where rows hold it: the first
    differing tensor of ``check``'s rows ``group`` and its module (else its first bad row), and from all ``rows``
    whether the forward already differs, the regions seen recomputing, the generators whose states differ between
    the twins and torch's own words when a twin raised."""
    bad = [r for r in group if r.status in BAD]
    first = next((r for r in bad if r.role in roles_of(Kind.PARITY)), None)
    raised = next((r for r in bad if r.role == Role.EXCEPTION), None)
    lead = first or raised or bad[0]
    module = f", in module {m}" if (m := module_of(lead)) else ""
    what = f"the first differing {'tensor' if first else 'failing row'} is {lead.item}"
    shown = [] if lead is raised else [f"{what} ({lead.detail.split('; ')[0][:160]}){module}"]
    forward = [r for r in rows if r.role in (Role.LOSS, Role.OUTPUT)]
    if differs := next((r for r in forward if r.status in BAD), None):
        shown.append(f"the forward already differs ({differs.item}), before any backward")
    elif forward and lead.role not in (Role.LOSS, Role.OUTPUT) and first:
        shown.append("the loss and outputs agree, so only what backward computes differs")
    shown += [f"{r.item} by the recompute twin: {r.value:g}" for r in rows if r.role == Role.OBSERVED]
    if generators := [generator(r) for r in rows if r.role == Role.RNG and r.status in BAD and r is not lead]:
        shown.append(f"the state of {', '.join(generators)} differs between the twins")
    shown += [quote(raised)] if raised else []
    cause = "no known pattern matches these rows; " + "; ".join(shown)
    fix = (
        f"start from {lead.item}, which {check} saw differ first: find what the recomputed region computes "
        "differently for it (state read or written in the forward, randomness outside torch's generator, a "
        "process-wide flag such as a precision setting that differs while backward recomputes, a custom "
        "autograd.Function); the rows below name every tensor and both values"
    )
    return cause, fix
