"""The recompute claim under sharding (``distributed.world_size > 1``): DDP or FSDP2 twins.

The method of PyTorch's own FSDP2 tests: every rank runs its equal share of the same global
batch; gradients and parameters are compared as full tensors (``DTensor.full_tensor()`` under
FSDP2, the all-reduced gradients under DDP), against

(a) the distributed plain twin (recompute's own effect; required, an A/A distributed plain
    twin beside it), and
(b) a single-process plain reference on the same global batch (sharding's own effect;
    advisory: reduction order may move the last bits).

Each rank's own loss, outputs, gradients before reduction, buffers, module attributes and
generator states are compared per rank (a ``rank`` column), so a difference visible on one rank
only is reported with its rank. Memory (saved activation bytes) and warm step time are measured
per rank, with the maximum over ranks (time: the slowest rank per step, paired bootstrap CI).

With world_size 1 the check adds no rows. Otherwise :func:`reportgen.distributed.ranks.run_sharded` runs
:data:`PARTS` on every rank: it starts the ranks with torch's elastic launcher, or, inside a
torchrun/srun launch, runs this process's part as one rank of that group; rank 0 gathers every
rank's rows.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from reportgen.checks.base import Check, Section
from reportgen.checks.distributed_cost import (  # noqa: F401
    ROLE_MAX_OVERHEAD,
    ROLE_MAX_PEAK,
    ROLE_MAX_SAVED,
    ROLE_MAX_STEP,
    ROLE_RANK_PEAK,
    ROLE_RANK_STEP,
    ROLE_RANK_TOTAL,
    local_share,
    memory_rows,
    time_rows,
)
from reportgen.config import (
    DIST_GRADIENT_PARITY,
    DIST_MEMORY,
    DIST_STEP_PARITY,
    DIST_TASK_METRICS,
    DIST_TIME,
    DIST_TRAJECTORY,
)
from reportgen.distributed.budget import budget_rows
from reportgen.distributed.full import dist_name, full, full_grads, full_optimizer_state, full_params
from reportgen.distributed.launch import Group, shard_batch
from reportgen.distributed.ranks import follow as ranks_follow
from reportgen.distributed.ranks import ranked, run_sharded, twin
from reportgen.distributed.sync import Drift, replicated_state, sync_row
from reportgen.distributed.sync import measure as measure_sync
from reportgen.distributed.wrapping import spread_twin
from reportgen.results import FAIL, INCONCLUSIVE, PASS, WARN, Role, Row
from reportgen.results.rows import aa_row, tensor_row
from reportgen.tasks import batch_to
from reportgen.training.loop import step_seed
from reportgen.training.user_step import make_optimizer, make_scheduler, optimizer_step, run_forward_backward
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import Snapshot, module_attributes, snapshot_rows

#: Roles of this check's rows that the generic roles do not name.
ROLE_REFERENCE = "sharding_reference"  #: a distributed twin vs the single-process plain reference


def distributed_checks(setup: Setup) -> list[Row]:
    """Every rank's rows of the sharded checks (none when ``distributed.world_size`` is 1), run by
    :func:`reportgen.distributed.ranks.run_sharded`: a rank that raised, crashed or hung gives ERROR rows naming
    it, and the parts it stopped NOT_RUN rows."""
    return run_sharded(setup, PARTS)


def follow(setup: Setup) -> list[Row] | None:
    """This process's part as one rank of a torchrun/srun launch (every rank's rows on rank 0, None
    on the others); ``run`` calls it on ranks other than 0."""
    return ranks_follow(setup, PARTS)


def _twin(setup: Setup, group: Group, recompute: bool):
    """A fresh twin (shared initial weights), spread over the ranks by ``distributed.strategy``."""
    return spread_twin(setup, group, recompute)


def _local(setup: Setup, group: Group) -> tuple:
    return local_share(setup, group)


def reference_grads(setup: Setup, world_size: int) -> tuple[Any, dict]:
    """The single-process plain reference on the same global batch: the plain twin's gradients on
    each rank's share, with that rank's generator draws (every rank seeds ``forward_seed``), averaged
    over the shares: what DDP/FSDP2 compute, without sharding. Returns ``(model, grads)``; the
    model holds the averaged gradients (ready for one optimizer step)."""
    model, per_rank = setup.build(False), []
    for rank in range(world_size):
        model.zero_grad(set_to_none=True)
        per_rank.append(
            run_forward_backward(
                setup.task, model, shard_batch(setup.batch, rank, world_size), setup.cfg.forward_seed
            ).grads
        )
    grads = {}
    for name in per_rank[0]:
        parts = [g.get(name) for g in per_rank]  # None on any share: None (never skipped)
        grads[name] = (
            None if any(p is None for p in parts) else (sum(p.double() for p in parts) / world_size).to(parts[0].dtype)
        )
    for name, p in model.named_parameters():
        p.grad = None if grads.get(name) is None else grads[name].clone()
    return model, grads


def _reference_rows(check: str, prefix: str, reference: dict, plain: dict, recompute: dict, rtol, atol) -> list[Row]:
    """Advisory rows (WARN on a miss): each distributed twin vs the single-process reference."""
    rows = []
    for variant, values in (("plain", plain), ("recompute", recompute)):
        for name in sorted(set(reference) | set(values)):
            row = tensor_row(
                check,
                f"{prefix}{name} ({variant}, distributed vs single-process)",
                reference.get(name),
                values.get(name),
                rtol,
                atol,
                ROLE_REFERENCE,
            )
            row.variant, row.on_miss = variant, WARN
            row.__post_init__()  # judged again by results.judge with the advisory on_miss
            rows.append(row)
    return rows


def gradient_rows(setup: Setup, group: Group) -> list[Row]:
    """One forward and backward of the distributed plain, A/A and recompute twins on this rank's share.

    Returns:
        Per rank: loss and every output leaf (``rank`` column). On rank 0 also: every parameter's
        full gradient (recompute vs plain, with the A/A twin), the A/A row, and (advisory) both
        distributed twins vs the single-process reference.
    """
    rtol, atol = setup.tolerance()
    local, seed = _local(setup, group), setup.cfg.forward_seed
    runs, drifts = {}, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with twin(name):
            model = _twin(setup, group, recompute)
            out = run_forward_backward(setup.task, model, local, seed)
            runs[name] = (out, full_grads(model))  # collective under FSDP: every rank, same order
        drifts[name] = measure_sync(
            {f"{n}.grad": g for n, g in runs[name][1].items() if g is not None} | replicated_state(model),
            group,
            1,
            rtol,
            atol,
        )
    (plain, plain_g), (aa, aa_g), (rc, rc_g) = runs["plain"], runs["aa"], runs["recompute"]
    rows = [
        ranked(
            tensor_row(DIST_GRADIENT_PARITY, "loss", plain.loss, rc.loss, rtol, atol, Role.LOSS, aa=aa.loss), group.rank
        )
    ]
    rows += [
        ranked(
            tensor_row(
                DIST_GRADIENT_PARITY,
                name,
                plain.output.get(name),
                rc.output.get(name),
                rtol,
                atol,
                Role.OUTPUT,
                aa=aa.output.get(name),
            ),
            group.rank,
        )
        for name in dict.fromkeys([*plain.output, *rc.output])
    ]
    rows.append(ranked(local_gradients_row(setup, local, rtol, atol), group.rank))
    if group.rank != 0:
        return rows
    grads = [
        tensor_row(
            DIST_GRADIENT_PARITY,
            f"{name}.grad (full)",
            plain_g.get(name),
            rc_g.get(name),
            rtol,
            atol,
            Role.PARAM_GRAD,
            aa=aa_g.get(name),
        )
        for name in sorted(set(plain_g) | set(rc_g))
    ]
    _, reference = reference_grads(setup, group.world_size)
    rows += grads + [aa_row(DIST_GRADIENT_PARITY, rows + grads)]
    rows += [
        sync_row(DIST_GRADIENT_PARITY, name, [drift], group.world_size, rtol, atol, "backward")
        for name, drift in drifts.items()
    ]
    return rows + _reference_rows(
        DIST_GRADIENT_PARITY,
        "",
        {f"{n}.grad": g for n, g in reference.items()},
        {f"{n}.grad": g for n, g in plain_g.items()},
        {f"{n}.grad": g for n, g in rc_g.items()},
        rtol,
        atol,
    )


def local_gradients_row(setup: Setup, local: tuple, rtol, atol) -> Row:
    """This rank's own gradients before any reduction: the unsharded plain and recompute twins on
    this rank's share (what DDP/FSDP2 compute locally before reducing). A fault that shows on one
    rank only (a rank-dependent branch inside a recomputed block) is named by its rank here, while
    the reduced full gradients only show that something differs.

    Returns:
        One row: tensors outside tolerance (``== 0``), the worst tensor named in ``detail``.
    """
    seed = setup.cfg.forward_seed
    with twin("plain"):
        plain = run_forward_backward(setup.task, setup.build(False), local, seed)
    with twin("recompute"):
        rc = run_forward_backward(setup.task, setup.build(True), local, seed)
    compared = [
        tensor_row(DIST_GRADIENT_PARITY, f"{n}.grad", plain.grads.get(n), rc.grads.get(n), rtol, atol)
        for n in sorted(set(plain.grads) | set(rc.grads))
    ]
    bad = sorted((r for r in compared if r.status != PASS), key=lambda r: -float(r.extra.get("excess", 0.0)))
    equal = all(bool(r.extra.get("bitwise_equal")) for r in compared)
    detail = (
        f"all {len(compared)} gradients of this rank's share {'bitwise equal' if equal else 'within tolerance'}"
        if not bad
        else f"{len(bad)} of {len(compared)} gradients of this rank's share differ before reduction; "
        f"worst {bad[0].item} (max abs err {bad[0].value:.3g}, {bad[0].detail})"
    )
    return Row(
        check=DIST_GRADIENT_PARITY,
        item="local gradients before reduction",
        variant="recompute",
        metric="tensors_outside_tolerance",
        value=float(len(bad)),
        threshold="0",
        comparator="==",
        detail=detail,
        role=Role.RANK_LOCAL_GRADS,
        unit="tensors",
        threshold_value=0.0,
        extra={"bitwise_equal": equal, "worst_tensor": bad[0].item if bad else ""},
    )


def _snapshot(model, optimizer, rng: dict, loss) -> Snapshot:
    """A distributed twin's state after its step, in full tensors and plain names: parameters and
    optimizer state (collectives under FSDP2), buffers, plain module attributes (of the model inside
    DDP's wrapper), this rank's generator states after backward."""
    inner = getattr(model, "module", model) if hasattr(model, "no_sync") else model  # DDP keeps the model in .module
    buffers = {dist_name(n): full(b) for n, b in inner.named_buffers()}
    return Snapshot(
        full_params(model),
        full_optimizer_state(model, optimizer),
        buffers,
        module_attributes(inner),
        {k: v.clone() for k, v in rng.items()},
        loss,
    )


#: Roles of the per-rank state rows (each rank's own buffers, attributes and generators).
STATE_ROLES = {Role.BUFFER, Role.ATTRIBUTE, Role.RNG, Role.IGNORED}


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
    local, seed = _local(setup, group), setup.cfg.forward_seed
    snaps, drifts = {}, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with twin(name):
            model = _twin(setup, group, recompute)
            optimizer = make_optimizer(setup.task, setup.cfg.parity.optimizer, model)
            out = run_forward_backward(setup.task, model, local, seed)
            optimizer_step(setup.task, model, optimizer, make_scheduler(setup.task, optimizer))
            snaps[name] = _snapshot(model, optimizer, out.rng, out.loss)
        drifts[name] = measure_sync(replicated_state(model), group, 1, rtol, atol)
    compared = snapshot_rows(
        snaps["plain"], snaps["recompute"], snaps["aa"], rtol, atol, list(setup.cfg.state.ignore_attributes)
    )
    rows = []
    for row in compared:
        row.check = DIST_STEP_PARITY
        if row.role in STATE_ROLES:
            rows.append(ranked(row, group.rank))
        elif group.rank == 0:
            row.item += " (full)"
            rows.append(row)
    rows.append(ranked(aa_row(DIST_STEP_PARITY, rows), group.rank))
    if group.rank != 0:
        return rows
    rows += [sync_row(DIST_STEP_PARITY, name, [drift], group.world_size, rtol, atol) for name, drift in drifts.items()]
    reference, _ = reference_grads(setup, group.world_size)
    optimizer = make_optimizer(setup.task, setup.cfg.parity.optimizer, reference)
    optimizer_step(setup.task, reference, optimizer, make_scheduler(setup.task, optimizer))
    ref_params = {n: p.detach().clone() for n, p in reference.named_parameters()}
    return rows + _reference_rows(
        DIST_STEP_PARITY, "param ", ref_params, snaps["plain"].params, snaps["recompute"].params, rtol, atol
    )


def _trajectory(setup: Setup, group: Group, recompute: bool) -> tuple[list[Snapshot], list[Drift | None]]:
    """``parity.steps`` optimizer steps of one distributed twin on the training stream; a snapshot
    after each. Every rank draws the same global batches (``task.make_batch`` with a generator seeded
    by ``cfg.seed``, ``parity.batch_size`` examples) and trains on its share; before step ``k`` every
    generator is seeded with ``step_seed(forward_seed, seed, k)``, as the single-process trajectory.
    After every step the ranks' replicated state is compared (:mod:`reportgen.distributed.sync`)."""
    cfg, (rtol, atol) = setup.cfg, setup.tolerance()
    model = _twin(setup, group, recompute)
    optimizer = make_optimizer(setup.task, cfg.parity.optimizer, model)
    scheduler = make_scheduler(setup.task, optimizer)
    generator = torch.Generator().manual_seed(int(cfg.seed))
    snaps, drifts = [], []
    for k in range(int(cfg.parity.steps)):
        batch = batch_to(setup.task.make_batch(generator, int(cfg.parity.batch_size)), setup.device, setup.dtype)
        optimizer.zero_grad(set_to_none=True)
        seed = None if cfg.forward_seed is None else step_seed(cfg.forward_seed, cfg.seed, k)
        out = run_forward_backward(setup.task, model, shard_batch(batch, group.rank, group.world_size), seed)
        optimizer_step(setup.task, model, optimizer, scheduler)
        snaps.append(_snapshot(model, optimizer, out.rng, out.loss))
        drifts.append(measure_sync(replicated_state(model), group, k + 1, rtol, atol))
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
        with twin(name):
            runs[name], drifts[name] = _trajectory(setup, group, recompute)
    rows = (
        []
        if group.rank
        else [sync_row(DIST_TRAJECTORY, name, d, group.world_size, rtol, atol) for name, d in drifts.items()]
    )
    for k, (p, a, r) in enumerate(zip(runs["plain"], runs["aa"], runs["recompute"]), start=1):
        compared = [
            x
            for x in snapshot_rows(p, r, a, rtol, atol, list(setup.cfg.state.ignore_attributes))
            if x.role != Role.IGNORED and (group.rank == 0 or x.role in STATE_ROLES)
        ]
        for variant, key, on_miss in (("recompute", "excess", FAIL), ("aa", "aa_excess", INCONCLUSIVE)):
            excess = [(float(x.extra.get(key, math.inf)), x) for x in compared]
            moved = [x.item for e, x in excess if not e <= 0]
            worst = max((e for e, _ in excess), key=lambda e: e if e == e else math.inf, default=0.0)
            detail = (
                f"all {len(compared)} items within tolerance"
                if not moved
                else f"{len(moved)} of {len(compared)} items outside tolerance, e.g. {', '.join(moved[:3])}"
            )
            rows.append(
                ranked(
                    Row(
                        check=DIST_TRAJECTORY,
                        item=f"step {k}",
                        variant=variant,
                        metric="items_outside_tolerance",
                        value=float(len(moved)),
                        threshold="allclose per item",
                        comparator="allclose",
                        detail=detail,
                        role=Role.TRAJECTORY,
                        unit="items",
                        on_miss=on_miss,
                        extra={"step": k, "excess": worst, "items": len(compared)},
                    ),
                    group.rank,
                )
            )
    return rows


#: The parts every rank runs, in order (section, function); module-level functions, so a spawned rank
#: imports them by name.
PARTS = (
    (DIST_GRADIENT_PARITY, gradient_rows),
    (DIST_STEP_PARITY, step_rows),
    (DIST_TRAJECTORY, trajectory_rows),
    (DIST_MEMORY, memory_rows),
    (DIST_TIME, time_rows),
    (DIST_TASK_METRICS, budget_rows),
)

CHECK = Check(
    distributed_checks,
    (
        Section(
            DIST_GRADIENT_PARITY,
            "Sharded twins (distributed.strategy) on every rank's share of the same global "
            "batch: each rank's loss and outputs, then every parameter's full gradient, recompute vs the distributed "
            "plain twin; sharding's own effect (vs a single-process reference) is shown apart and advisory.",
            required=False,
            distributed=True,
        ),
        Section(
            DIST_STEP_PARITY,
            "One optimizer step on the sharded twins: full parameters and optimizer state, and "
            "each rank's generator states after backward.",
            required=False,
            distributed=True,
        ),
        Section(
            DIST_TRAJECTORY,
            "Several optimizer steps of the sharded twins on the training stream, compared after "
            "every step (full parameters and optimizer state; each rank's buffers, attributes and generators).",
            required=False,
            distributed=True,
        ),
        Section(
            DIST_MEMORY,
            "Bytes autograd keeps for backward on each rank, and the maximum over ranks.",
            required=False,
            distributed=True,
        ),
        Section(
            DIST_TIME,
            "Warm training steps of the sharded twins; each step's time is the slowest rank's.",
            required=False,
            distributed=True,
        ),
        Section(
            DIST_TASK_METRICS,
            "The sharded twins trained to the same global accepted-example budget (every rank "
            "trains on its share of each global batch; a step counts once, for all ranks), then evaluated on held-out "
            "data: the metric and every full trained parameter, recompute vs plain.",
            required=False,
            distributed=True,
        ),
    ),
)
