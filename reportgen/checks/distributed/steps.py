"""Step and trajectory parity of the sharded twins (parts of :mod:`reportgen.checks.distributed.check`): one
optimizer step, then ``parity.steps`` steps on the training stream, compared in full tensors on rank 0
and each rank's own state (buffers, attributes, generators) per rank."""

from __future__ import annotations

import functools
import math

from reportgen.checks.distributed.cost import local_share
from reportgen.checks.distributed.grads import reference_grads, reference_rows
from reportgen.config import DIST_STEP_PARITY, DIST_TRAJECTORY, STATE_PARITY
from reportgen.distributed.full import dist_name, full, full_optimizer_state, full_params
from reportgen.distributed.launch import Group, shard_batch
from reportgen.distributed.ranks import ranked
from reportgen.distributed.sync import Drift, replicated_state, sync_row
from reportgen.distributed.sync import measure as measure_sync
from reportgen.distributed.wrapping import spread_twin
from reportgen.results import Role, Row, Status
from reportgen.results.raised import raised_in
from reportgen.results.rows import aa_row, step_row
from reportgen.training.trajectory import trajectory
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import Snapshot, held_generators, module_attributes, snapshot_rows
from reportgen.twins.twin import Twin


def _snapshot(twin: Twin) -> Snapshot:
    """A distributed twin's state after its latest step, in full tensors and plain names: parameters and
    optimizer state (collectives under FSDP2), buffers, plain module attributes (of the model inside
    DDP's wrapper), this rank's generator states after backward and its modules' own after the step."""
    model, last = twin.model, twin.last
    assert last is not None, "a twin's snapshot is taken after its step"
    inner = getattr(model, "module", model) if hasattr(model, "no_sync") else model  # DDP keeps the model in .module
    buffers = {dist_name(n): full(b) for n, b in inner.named_buffers()}
    return Snapshot(
        full_params(model),
        full_optimizer_state(model, twin.optimizer),
        buffers,
        module_attributes(inner),
        {k: v.clone() for k, v in last.rng.items()} | held_generators(inner),
        last.loss,
    )


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
    snaps, drifts = {}, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            twin = spread_twin(setup, group, recompute)
            twin.step(local, seed)
            snaps[name] = _snapshot(twin)
        drifts[name] = measure_sync(replicated_state(twin.model), group, 1, rtol, atol)
    compared = snapshot_rows(
        snaps["plain"], snaps["recompute"], snaps["aa"], rtol, atol, setup.config.state.ignore_attributes
    )
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
    reference, _ = reference_grads(setup, group.world_size)
    reference.apply()
    ref_params = {n: p.detach().clone() for n, p in reference.model.named_parameters()}
    return rows + reference_rows(
        DIST_STEP_PARITY, "param ", ref_params, snaps["plain"].params, snaps["recompute"].params, rtol, atol
    )


def _trajectory(setup: Setup, group: Group, recompute: bool) -> tuple[list[Snapshot], list[Drift | None]]:
    """``parity.steps`` optimizer steps of one distributed twin on the training stream, by the single-process
    trajectory's own loop (:func:`reportgen.training.trajectory.trajectory`: same global batches and per-step
    seeds on every rank, each rank training on its share); a full snapshot after each, and the ranks'
    replicated state compared (:mod:`reportgen.distributed.sync`)."""
    rtol, atol = setup.tolerance()
    twin = spread_twin(setup, group, recompute)
    share = functools.partial(shard_batch, rank=group.rank, world_size=group.world_size)
    snaps, drifts = [], []
    for k, snap in enumerate(trajectory(setup, recompute, twin=twin, share=share, snapshot=_snapshot)):
        snaps.append(snap)
        drifts.append(measure_sync(replicated_state(twin.model), group, k + 1, rtol, atol))
    return snaps, drifts


def trajectory_rows(setup: Setup, group: Group) -> list[Row]:
    """The distributed plain, A/A and recompute twins, ``parity.steps`` steps each, compared after every step.

    Returns:
        Per step and rank: one ``recompute`` row (``allclose`` on the worst excess over every compared
        item: on rank 0 the full parameters and optimizer state and its own state, on the other ranks
        their own buffers, attributes and generators) and one ``aa`` row (INCONCLUSIVE when missed).
    """
    rtol, atol = setup.tolerance()
    runs, drifts = {}, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            runs[name], drifts[name] = _trajectory(setup, group, recompute)
    rows = (
        []
        if group.rank
        else [sync_row(DIST_TRAJECTORY, name, d, group.world_size, rtol, atol) for name, d in drifts.items()]
    )
    for k, (p, a, r) in enumerate(zip(runs["plain"], runs["aa"], runs["recompute"]), start=1):
        compared = [
            x
            for x in snapshot_rows(p, r, a, rtol, atol, setup.config.state.ignore_attributes)
            if x.role != Role.IGNORED and (group.rank == 0 or x.check == STATE_PARITY)
        ]
        for variant, key, on_miss in (("recompute", "excess", Status.FAIL), ("aa", "aa_excess", Status.INCONCLUSIVE)):
            excess = [(float(x.extra.get(key, math.inf)), x) for x in compared]
            moved = [x.item for e, x in excess if not e <= 0]
            worst = max((e for e, _ in excess), key=lambda e: e if e == e else math.inf, default=0.0)
            extra = {"step": k, "excess": worst, "items": len(compared)}
            row = step_row(
                DIST_TRAJECTORY, k, "items_outside_tolerance", len(moved), "items", variant, on_miss, moved, extra
            )
            rows.append(ranked(row, group.rank))
    return rows
