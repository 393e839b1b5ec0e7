"""Step and trajectory parity of the sharded twins (parts of :mod:`reportgen.checks.distributed.check`): one
optimizer step, then ``parity.steps`` steps on the training stream, compared in full tensors on rank 0
and each rank's own state (buffers, attributes, generators) per rank."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from reportgen.checks.distributed.cost import local_share
from reportgen.checks.distributed.grads import reference_grads, reference_rows, reference_twin
from reportgen.config import DIST_STEP_PARITY, DIST_TRAJECTORY, STATE_PARITY, STEP_PARITY
from reportgen.distributed.full import dist_name, each_full, full, full_optimizer_state, full_params, is_fsdp1
from reportgen.distributed.launch import Group, shard_batch
from reportgen.distributed.ranks import ranked
from reportgen.distributed.sync import Drift, replicated_state, sync_row
from reportgen.distributed.sync import measure as measure_sync
from reportgen.distributed.wrapping import spread_twin
from reportgen.results import Role, Row, Status
from reportgen.results.compared import tensor_row
from reportgen.results.raised import raised_in
from reportgen.results.rows import aa_row, step_row
from reportgen.training.trajectory import trajectory
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import (
    ENVELOPED,
    Snapshot,
    columns_of,
    held_generators,
    module_attributes,
    snapshot_rows,
    with_aa,
)
from reportgen.twins.twin import Twin


def _snapshot(twin: Twin) -> Snapshot:
    """A distributed twin's state after its latest step as this rank holds it, in plain names, no copy of a shard:
    parameters and optimizer state as held (``DTensor`` shards under FSDP2, replicas under DDP; FSDP1 gathers them,
    a collective, and only rank 0 keeps them), buffers, plain module attributes (of the model inside DDP's
    wrapper), this rank's generator states after backward and its modules' own after the step. Compared one whole
    tensor at a time by :func:`_compared`."""
    model, last = twin.model, twin.last
    assert last is not None, "a twin's snapshot is taken after its step"
    inner = getattr(model, "module", model) if hasattr(model, "no_sync") else model  # DDP keeps the model in .module
    buffers = {dist_name(n): full(b) for n, b in inner.named_buffers()}
    if is_fsdp1(model):
        mine = dist.get_rank() == 0
        params = {n: (t if mine else None) for n, t in full_params(model).items()}
        optimizer = {n: (t if mine else None) for n, t in full_optimizer_state(model, twin.optimizer).items()}
    else:
        params = {dist_name(n): p.detach() for n, p in model.named_parameters()}
        names = {p: dist_name(n) for n, p in model.named_parameters()}
        optimizer = {
            f"{names[p]}.{k}": (v.detach() if torch.is_tensor(v) else torch.tensor(v))
            for p, values in twin.optimizer.state.items()
            for k, v in values.items()
        }
    return Snapshot(
        params,  # None on ranks other than 0 under FSDP1
        optimizer,
        buffers,
        module_attributes(inner),
        {k: v.clone() for k, v in last.rng.items()} | held_generators(inner),
        last.loss,
    )


def _compared(
    plain: Snapshot,
    other: Snapshot,
    rtol: float | None,
    atol: float | None,
    ignore: Sequence[str],
    rank: int,
    reference: dict[str, Tensor] | None = None,
) -> list[Row]:
    """:func:`reportgen.twins.snapshot.snapshot_rows` of two held snapshots (no A/A twin: the caller adds its
    columns, :func:`reportgen.twins.snapshot.with_aa`) without ever holding a whole twin: parameters and optimizer
    state one whole tensor at a time (:func:`reportgen.distributed.full.each_full`, a collective on every rank;
    their rows on rank 0), each rank's own buffers, attributes and generators as they are. ``reference``: rank 0's
    single-process parameters after one step, compared (advisory) with both twins' parameters while they are whole.
    """
    bare = lambda s: dataclasses.replace(s, params={}, optimizer_state={})
    rows = snapshot_rows(bare(plain), bare(other), None, rtol, atol, ignore)
    for role, (prefix, part) in list(ENVELOPED.items())[:2]:  # parameters, optimizer state (optimizer-step parity)
        for name, (p, r) in each_full(getattr(plain, part), getattr(other, part), keep=rank == 0):
            if rank == 0:
                rows.append(tensor_row(STEP_PARITY, f"{prefix}{name}", p, r, rtol, atol, role))
                if reference is not None and role == Role.PARAM:
                    rows += reference_rows(
                        DIST_STEP_PARITY, prefix, {name: reference.get(name)}, {name: p}, {name: r}, rtol, atol
                    )
            del p, r
    return rows


def step_rows(setup: Setup, group: Group) -> list[Row]:
    """One step of ``parity.optimizer`` on each distributed twin (plain, A/A, recompute).

    Returns:
        Per rank (``rank`` column): buffers, plain module attributes and generator states after
        backward (bitwise), and that rank's A/A row. On rank 0 also: full parameters and optimizer
        state, recompute vs plain, and (advisory) the full parameters vs one step of the
        single-process reference. Compared by :func:`reportgen.twins.snapshot.snapshot_rows`, with
        ``state.ignore_attributes`` honoured.
    """
    rtol, atol = setup.tolerance()
    local, seed = local_share(setup, group), setup.config.forward_seed
    reference = None
    start = reference_twin(setup, group)  # first, while no sharded twin is held (a collective under a meta build)
    if start is not None:  # rank 0: one step of the single-process reference
        reference_grads(start, setup, group.dp_size)
        start.apply()
        reference = {n: p.detach() for n, p in start.model.named_parameters()}
    del start  # its gradients and optimizer state with it
    ignore, drifts, columns = setup.config.state.ignore_attributes, {}, {}
    compared: list[Row] = []
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            twin = spread_twin(setup, group, recompute)
            twin.step(local, seed)
            twin.model.zero_grad(set_to_none=True)  # gradients are the gradient part's: freed here
            snap = _snapshot(twin)
        drifts[name] = measure_sync(replicated_state(twin.model), group, 1, rtol, atol)
        del twin
        if name == "plain":
            plain = snap
            continue
        # the A/A twin is compared and dropped before the recompute twin is made: two training states at most
        against = _compared(plain, snap, rtol, atol, ignore, group.rank, reference)
        mine = "plain" if name == "aa" else "recompute"  # the reference rows of this pass's own twin
        compared += [r for r in against if r.role == Role.SHARDING_REFERENCE and r.variant == mine]
        against = [r for r in against if r.role != Role.SHARDING_REFERENCE]
        if name == "aa":
            columns = columns_of(against)
        else:
            compared += with_aa(against, columns)
        del snap, against
    del plain, reference
    advisory = [row for row in compared if row.role == Role.SHARDING_REFERENCE]
    compared = [row for row in compared if row.role != Role.SHARDING_REFERENCE]
    rows = []
    for row in compared:
        own = row.check == STATE_PARITY  # each rank's own buffers, attributes, generators (snapshot_rows)
        row.check = DIST_STEP_PARITY
        if own:
            rows.append(ranked(row, group.rank))
        elif group.rank == 0:
            row.item += " (full)"
            rows.append(row)
    rows.append(ranked(aa_row(DIST_STEP_PARITY, rows), group.rank))
    if group.rank != 0:
        return rows
    rows += [sync_row(DIST_STEP_PARITY, name, [drift], group.world_size, rtol, atol) for name, drift in drifts.items()]
    return rows + sorted(advisory, key=lambda row: row.variant != "plain")


def _pair(setup: Setup, group: Group, other: str) -> tuple[list[list[Row]], dict[str, list[Drift | None]]]:
    """The distributed plain twin and ``other`` (``aa`` or ``recompute``) stepped in lockstep, ``parity.steps``
    steps each, by the single-process trajectory's own loop (:func:`reportgen.training.trajectory.trajectory`: same
    global batches and per-step seeds on every rank, each rank training on its share): two twins resident, compared
    after every step where they are (:func:`_compared`, one whole tensor at a time), no stored copy of a step.

    Returns:
        ``(per step: this rank's compared rows, {twin: per step its ranks' replicated state compared})``.
    """
    rtol, atol = setup.tolerance()
    ignore, rank = setup.config.state.ignore_attributes, group.rank
    share = functools.partial(shard_batch, dp_rank=group.dp_rank, dp_size=group.dp_size)
    names, runs = ("plain", other), {}
    for name in names:
        with raised_in(name):
            twin = spread_twin(setup, group, name == "recompute")
        runs[name] = (twin, trajectory(setup, name == "recompute", twin=twin, share=share, snapshot=_snapshot))
    steps: list[list[Row]] = []
    drifts: dict[str, list[Drift | None]] = {name: [] for name in names}
    for k in range(setup.config.parity.steps):
        snaps = {}
        for name in names:
            twin, stream = runs[name]
            with raised_in(name):
                snaps[name] = next(stream)
            drifts[name].append(measure_sync(replicated_state(twin.model), group, k + 1, rtol, atol))
        compared = _compared(snaps["plain"], snaps[other], rtol, atol, ignore, rank)
        steps.append([x for x in compared if x.role != Role.IGNORED and (rank == 0 or x.check == STATE_PARITY)])
        del snaps, compared
    return steps, drifts


def trajectory_rows(setup: Setup, group: Group) -> list[Row]:
    """The distributed plain twin beside its A/A twin, then beside the recompute twin (lockstep pairs,
    :func:`_pair`), ``parity.steps`` steps each, compared after every step.

    Returns:
        Per step and rank: one ``recompute`` row (``allclose`` on the worst excess over every compared
        item: on rank 0 the full parameters and optimizer state and its own state, on the other ranks
        their own buffers, attributes and generators) and one ``aa`` row (INCONCLUSIVE when missed).
    """
    rtol, atol = setup.tolerance()
    with_aa, drifts = _pair(setup, group, "aa")
    with_rc, rc_drifts = _pair(setup, group, "recompute")
    drifts["recompute"] = rc_drifts["recompute"]
    rows = (
        []
        if group.rank
        else [sync_row(DIST_TRAJECTORY, name, d, group.world_size, rtol, atol) for name, d in drifts.items()]
    )
    for k, (aa_rows, rc_rows) in enumerate(zip(with_aa, with_rc, strict=True), start=1):
        for variant, compared, on_miss in (("recompute", rc_rows, Status.FAIL), ("aa", aa_rows, Status.INCONCLUSIVE)):
            excess = [(float(x.extra.get("excess", math.inf)), x) for x in compared]
            moved = [x.item for e, x in excess if not e <= 0]
            worst = max((e for e, _ in excess), key=lambda e: e if e == e else math.inf, default=0.0)
            extra = {"step": k, "excess": worst, "items": len(compared)}
            row = step_row(
                DIST_TRAJECTORY, k, "items_outside_tolerance", len(moved), "items", variant, on_miss, moved, extra
            )
            rows.append(ranked(row, group.rank))
    return rows
