"""Ranks in sync: after each step of a sharded check, every tensor each rank holds whole (a replica) is compared
with the same tensor on the first rank of its replica group. Under DDP every parameter, gradient and buffer must be
the same on every rank after a step; a bucket whose all-reduce never ran (a parameter that got no gradient under
reentrant recompute) leaves the ranks drifting apart silently. Under FSDP the buffers (and any parameter left
outside every unit) are compared; a sharded parameter is one tensor spread over the ranks (its full tensor is
gathered from the shards, the same on every rank by construction), so it is not a replica.

Tensors are compared one at a time, by name and shape, in their own dtype (DESIGN.md, "Sharded runs"): the first
rank broadcasts one tensor, every rank judges its own copy and drops the received one, so the extra memory is the
largest tensor, never the model. Ranks that hold different names, or another shape or dtype under the same name,
are compared no further: an ERROR row names them, never "in sync". A drift in the recompute twin FAILs; in a plain
twin (plain or A/A) the claim is INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from reportgen.distributed.full import dist_name, is_fsdp1
from reportgen.distributed.launch import Group, gather_objects
from reportgen.results import BASELINE_TWINS, Role, Row, Status
from reportgen.results.compared import zero_count_row
from reportgen.results.distance import measure as distance
from reportgen.results.distance import tolerances


def replica(t: Tensor) -> Tensor | None:
    """The tensor as this rank holds it whole, or None for a shard: a plain tensor is itself, a ``DTensor`` whose
    placements are all ``Replicate`` its local tensor, a ``DTensor`` sharded on any mesh dimension None (a caller
    comparing within one mesh dimension's replica groups passes those local tensors itself)."""
    placements = getattr(t, "placements", None)
    if placements is None:
        return t
    return t.to_local() if all(p.is_replicate() for p in placements) else None


def replicated_state(model: nn.Module, grads: bool = False) -> dict[str, Tensor]:
    """``{plain name: tensor}`` of every parameter (``"<name>.grad"`` for its gradient when ``grads``) and buffer
    (``"buffer <name>"``) this rank holds whole (:func:`replica`), as it holds it: no collective, no copy. FSDP1's
    flat parameters are shards and left out."""
    inner = getattr(model, "module", model) if hasattr(model, "no_sync") else model  # DDP keeps the model in .module
    state: dict[str, Tensor] = {}
    if not is_fsdp1(model):
        for name, p in model.named_parameters():
            t = p.grad if grads else p
            if t is not None and (whole := replica(t)) is not None:
                state[dist_name(name) + (".grad" if grads else "")] = whole
    for name, b in inner.named_buffers():
        if not grads and (whole := replica(b)) is not None:
            state[f"buffer {dist_name(name)}"] = whole
    return state


@dataclass
class Drift:
    """Per rank, the tensors that differ from their replica group's first rank beyond tolerance after one step.

    Attributes:
        step: the step after which the ranks were compared (1 = the first).
        drifting: ``[(rank, tensor name, max abs difference)]`` in name order (first drifting tensor first).
        max_abs: largest absolute difference over every tensor and rank (0.0 when bitwise equal).
        tensors: tensors compared per rank.
        mismatched: one line per rank whose tensors do not match its group's first rank by name, shape or dtype
            (``"rank 1 holds head.weight as [4, 8] float32, rank 0 as [8, 8] float32"``); nothing was compared
            then, and the row is an ERROR.
        against: ``{rank: the rank it was compared with}`` for ranks compared with another rank than 0.
    """

    step: int
    drifting: list[tuple[int, str, float]] = field(default_factory=list)
    max_abs: float = 0.0
    tensors: int = 0
    mismatched: list[str] = field(default_factory=list)
    against: dict[int, int] = field(default_factory=dict)


def _signature(state: Mapping[str, Tensor]) -> dict[str, tuple[list[int], str]]:
    """``{name: (shape, dtype)}`` of ``state``."""
    return {n: (list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in state.items()}


def mismatches(signatures: Sequence[dict[str, tuple[list[int], str]]], ranks: Sequence[int]) -> list[str]:
    """One line per (rank, name) where a rank's tensors differ from ``signatures[0]``'s (its group's first rank,
    global rank ``ranks[0]``) by name, shape or dtype; empty when every rank holds the same tensors.

    Args:
        signatures: each rank's ``{name: (shape, dtype)}``, in group order.
        ranks: the global rank of each entry.
    """
    said = lambda s: f"{s[0]} {s[1]}"
    first, lines = signatures[0], []
    for rank, mine in zip(ranks[1:], signatures[1:], strict=True):
        for name in sorted(set(first) | set(mine)):
            if name not in mine:
                lines.append(f"rank {rank} holds no {name} (rank {ranks[0]}: {said(first[name])})")
            elif name not in first:
                lines.append(f"rank {rank} holds {name} ({said(mine[name])}), rank {ranks[0]} none")
            elif tuple(mine[name][0]) != tuple(first[name][0]) or mine[name][1] != first[name][1]:
                lines.append(
                    f"rank {rank} holds {name} as {said(mine[name])}, rank {ranks[0]} as {said(first[name])}: "
                    "different tensors under one name"
                )
    return lines


def _wire(t: Tensor, device: torch.device) -> Tensor:
    """``t`` as the collective carries it: contiguous, on ``device``; complex as real pairs, bool as uint8."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t.resolve_conj())
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.to(device).contiguous()


def measure(
    state: Mapping[str, Tensor],
    group: Group,
    step: int,
    rtol: float | None,
    atol: float | None,
    within: Any = None,
) -> Drift | None:
    """Compare this rank's ``state`` (:func:`replicated_state`) with the first rank of its replica group, one tensor
    at a time. Every rank of the run calls it (rank 0 gathers the verdicts over the control group).

    First the ranks of each group exchange ``{name: (shape, dtype)}``; when they differ nothing is compared and
    :attr:`Drift.mismatched` names them. Otherwise, in name order, the group's first rank broadcasts its tensor in
    its own dtype; each rank judges its own by ``|x - x0| <= atol + rtol |x0|`` (``rtol``/``atol`` None:
    ``assert_close``'s defaults for the dtype; :func:`reportgen.results.distance.measure`, float64 chunks) and
    drops what it received. Peak extra memory: the largest tensor (plus a float64 chunk).

    Args:
        state: ``{name: tensor}`` this rank holds whole; tensors on any device.
        group: this rank's :class:`reportgen.distributed.launch.Group`.
        step: the step after which the ranks are compared (1 = the first).
        rtol, atol: the parity tolerance (None: the dtype's default).
        within: the process group of ranks that must hold the same tensors (a replica group of an N-D mesh,
            e.g. ``mesh["dp_replicate"].get_group()``); None: every rank (the gloo control group). Tensors travel
            on the host for a gloo group, on this rank's device for an NCCL one.

    Returns:
        On global rank 0 the :class:`Drift` of every rank; None on the others.
    """
    pg = group.control if within is None else within
    members = dist.get_process_group_ranks(pg)
    first = members[0]
    signatures: list[Any] = [None] * len(members)
    dist.all_gather_object(signatures, _signature(state), group=pg)
    mismatched = mismatches(signatures, members)
    verdicts: list[tuple[str, float, bool]] = []
    if not mismatched:
        device = group.device if dist.get_backend(pg) == "nccl" else torch.device("cpu")
        for name in sorted(state):
            mine = _wire(state[name], device)
            received = mine if group.rank == first else torch.empty_like(mine)
            dist.broadcast(received, src=first, group=pg)
            if group.rank != first:
                r, t = tolerances(state[name].dtype, rtol, atol)
                d = distance(mine, received, r, t)
                verdicts.append((name, d.max_abs_err, d.worst_excess <= 0))
            del received, mine  # dropped at once: one tensor at a time
    gathered = gather_objects((first, len(state), mismatched, verdicts), group)
    if gathered is None:
        return None
    drift = Drift(step, tensors=max((g[1] for g in gathered), default=0))
    for rank, (src, _, said, per_tensor) in enumerate(gathered):
        drift.mismatched += [line for line in said if line not in drift.mismatched]
        if src != 0 and rank != src:
            drift.against[rank] = src
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
    drift; on a miss FAIL for the recompute twin, INCONCLUSIVE for a plain twin. Ranks that hold different
    tensors (names, shapes, dtypes: :attr:`Drift.mismatched`) give an ERROR row naming them.

    Raises:
        ValueError: a step without a :class:`Drift` (what :func:`measure` returns on other ranks).
    """
    drifts = [d for d in given if d is not None]
    if len(drifts) != len(given):
        raise ValueError("rank sync is judged on rank 0, where every step has a Drift")
    item, role = f"rank sync ({twin})", Role.RANK_SYNC
    if wrong := next((d for d in drifts if d.mismatched), None):
        more = f" and {len(wrong.mismatched) - 4} more" if len(wrong.mismatched) > 4 else ""
        detail = (
            f"the ranks hold different tensors in the {twin} twin, so they cannot be compared: "
            f"{'; '.join(wrong.mismatched[:4])}{more}. Each rank must hold the same names and shapes as the others "
            "of its replica group (a pipeline stage or a tensor-parallel shard is compared within its own group)"
        )
        extra = {"twin": twin, "mismatched": len(wrong.mismatched)}
        return Row.fact(
            check, item, role, detail, status=Status.ERROR, metric="tensors_out_of_sync", variant=twin, extra=extra
        )
    first = next((d for d in drifts if d.drifting), None)
    steps = f"after each of {len(drifts)} step(s)" if len(drifts) > 1 else f"after the {after}"
    tensors = max((d.tensors for d in drifts), default=0)
    if first is None:
        worst = max((d.max_abs for d in drifts), default=0.0)
        detail = (
            f"all {tensors} tensor(s) each rank holds whole (parameters, gradients and buffers that are replicas, "
            f"not shards) of the {twin} twin are the same on all {world_size} ranks {steps} "
            + ("(bitwise equal)" if worst == 0 else f"(max abs difference {worst:.3g}, within tolerance)")
        )
        value, bitwise = 0.0, worst == 0
    else:
        rank, name, diff = first.drifting[0]
        ranks = sorted({r for r, _, _ in first.drifting})
        when = f"step {first.step}" if len(drifts) > 1 else f"the {after}"
        detail = (
            f"the ranks drift apart in the {twin} twin after {when}: {name} differs between rank "
            f"{first.against.get(rank, 0)} and rank {rank} by {diff:.3g} ({tolerance_said(rtol, atol)}); "
            f"{len(first.drifting)} tensor(s) on rank(s) {', '.join(map(str, ranks))} out of tolerance; a gradient "
            "that was never all-reduced (a bucket DDP did not reduce) is the usual cause"
        )
        value, bitwise = float(len(first.drifting)), False
        if twin in BASELINE_TWINS:
            detail += "; the plain twin itself drifts, so recompute cannot be judged under this wrapping"
    on_miss = Status.INCONCLUSIVE if twin in BASELINE_TWINS else Status.FAIL
    extra = {"twin": twin, "bitwise_equal": bitwise, "first_drift_step": first.step if first else None}
    return zero_count_row(
        check, item, "tensors_out_of_sync", value, "tensors", role, detail, on_miss=on_miss, variant=twin, extra=extra
    )
