"""Ranks in sync: after each step of a sharded check, every rank's replicated state of one twin is compared
with rank 0's. Under DDP every parameter and buffer must be the same on every rank after a step; a bucket whose
all-reduce never ran (a parameter that got no gradient under reentrant recompute) leaves the ranks drifting
apart silently. Under FSDP the parameters are compared as full tensors, the buffers as each rank holds them.
A drift in the recompute twin FAILs; in a plain twin (plain or A/A) the claim is INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn

from reportgen.distributed.full import dist_name, full, full_params
from reportgen.distributed.launch import Group, gather_objects
from reportgen.results import BASELINE_TWINS, Role, Row, Status
from reportgen.results.compared import zero_count_row
from reportgen.results.distance import tolerances


def replicated_state(model: nn.Module) -> dict[str, Tensor]:
    """``{plain name: tensor}``: full parameters (a collective under FSDP) and this rank's buffers."""
    inner = getattr(model, "module", model) if hasattr(model, "no_sync") else model
    return full_params(model) | {f"buffer {dist_name(n)}": full(b) for n, b in inner.named_buffers()}


@dataclass
class Drift:
    """Per rank, the tensors that differ from rank 0's beyond tolerance after one step."""

    step: int
    #: ``[(rank, tensor name, max abs difference)]`` in name order (first drifting tensor first).
    drifting: list[tuple[int, str, float]] = field(default_factory=list)
    #: Largest absolute difference from rank 0 over every tensor and rank (0.0 when bitwise equal).
    max_abs: float = 0.0
    tensors: int = 0


def measure(state: dict[str, Tensor], group: Group, step: int, rtol: float | None, atol: float | None) -> Drift | None:
    """Compare this rank's ``state`` with rank 0's (every rank calls it, same names in the same order): rank 0's
    state, flattened to float64 (exact for every float dtype), is broadcast over the control group, each rank
    judges each tensor by ``|x - x0| <= atol + rtol |x0|`` (``rtol``/``atol`` None: ``assert_close``'s defaults
    for its dtype) and rank 0 gathers the verdicts.

    Returns:
        On rank 0 the :class:`Drift` of every rank; None on the others.
    """
    names = sorted(state)
    parts = [state[n].detach().to("cpu", torch.float64).flatten() for n in names]
    flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)
    ref = flat.clone()
    dist.broadcast(ref, src=0, group=group.control)
    mine, offset = [], 0
    for name in names:
        size = state[name].numel()
        a, b = flat[offset : offset + size], ref[offset : offset + size]
        offset += size
        diff = float((a - b).abs().max()) if size else 0.0
        r, t = tolerances(state[name].dtype, rtol, atol)
        ok = bool(torch.all((a - b).abs() <= t + r * b.abs())) if size else True
        mine.append((name, diff, ok))
    gathered = gather_objects(mine, group)
    if gathered is None:
        return None
    drift = Drift(step, tensors=len(names))
    for rank, per_tensor in enumerate(gathered):
        for name, diff, ok in per_tensor:
            drift.max_abs = max(drift.max_abs, diff)
            if not ok:
                drift.drifting.append((rank, name, diff))
    return drift


def tolerance_said(rtol: float | None, atol: float | None) -> str:
    """The tolerance as people read it."""
    if rtol is None and atol is None:
        return "tolerance: assert_close's defaults for each dtype"
    return f"atol={'dtype default' if atol is None else f'{atol:g}'} rtol={'dtype default' if rtol is None else f'{rtol:g}'}"


def sync_row(
    check: str,
    twin: str,
    given: Sequence[Drift | None],
    world_size: int,
    rtol: float | None,
    atol: float | None,
    after: str = "step",
) -> Row:
    """One ``rank sync`` row for ``twin`` over the steps of a check (rank 0).

    Judged ``== 0`` on the number of (rank, tensor) pairs out of tolerance at the first step with a
    drift; on a miss FAIL for the recompute twin, INCONCLUSIVE for a plain twin.

    Raises:
        ValueError: a step without a :class:`Drift` (what :func:`measure` returns on other ranks).
    """
    drifts = [d for d in given if d is not None]
    if len(drifts) != len(given):
        raise ValueError("rank sync is judged on rank 0, where every step has a Drift")
    first = next((d for d in drifts if d.drifting), None)
    steps = f"after each of {len(drifts)} step(s)" if len(drifts) > 1 else f"after the {after}"
    if first is None:
        worst = max((d.max_abs for d in drifts), default=0.0)
        detail = f"every parameter and buffer of the {twin} twin is the same on all {world_size} ranks {steps} " + (
            "(bitwise equal)" if worst == 0 else f"(max abs difference {worst:.3g}, within tolerance)"
        )
        value, bitwise = 0.0, worst == 0
    else:
        rank, name, diff = first.drifting[0]
        ranks = sorted({r for r, _, _ in first.drifting})
        when = f"step {first.step}" if len(drifts) > 1 else f"the {after}"
        detail = (
            f"the ranks drift apart in the {twin} twin after {when}: {name} differs between rank 0 and "
            f"rank {rank} by {diff:.3g} ({tolerance_said(rtol, atol)}); {len(first.drifting)} tensor(s) on rank(s) "
            f"{', '.join(map(str, ranks))} out of tolerance; a gradient that was never all-reduced (a bucket DDP "
            "did not reduce) is the usual cause"
        )
        value, bitwise = float(len(first.drifting)), False
        if twin in BASELINE_TWINS:
            detail += "; the plain twin itself drifts, so recompute cannot be judged under this wrapping"
    on_miss = Status.INCONCLUSIVE if twin in BASELINE_TWINS else Status.FAIL
    extra = {"twin": twin, "bitwise_equal": bitwise, "first_drift_step": first.step if first else None}
    item, role = f"rank sync ({twin})", Role.RANK_SYNC
    return zero_count_row(
        check, item, "tensors_out_of_sync", value, "tensors", role, detail, on_miss=on_miss, variant=twin, extra=extra
    )
