"""Gradient parity of the sharded twins (a part of :mod:`reportgen.checks.distributed.check`): each rank's
loss, outputs and own gradients before reduction, then every parameter's full gradient, recompute vs
the distributed plain twin; and the single-process plain reference on the same global batch that
shows sharding's own effect (advisory, also read by the step part)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from reportgen.checks.distributed.cost import local_share
from reportgen.config import DIST_GRADIENT_PARITY
from reportgen.distributed.full import dist_name, each_full, held_grads
from reportgen.distributed.launch import Group, shard_batch
from reportgen.distributed.ranks import ranked
from reportgen.distributed.sync import measure as measure_sync
from reportgen.distributed.sync import replicated_state, sync_row
from reportgen.distributed.wrapping import spread_twin
from reportgen.results import Role, Row, Status
from reportgen.results.compared import tensor_row, zero_count_row
from reportgen.results.raised import raised_in
from reportgen.results.rows import aa_row, zero_gradients_row
from reportgen.twins.forward import forward_backward
from reportgen.twins.setup import Setup
from reportgen.twins.template import on_meta
from reportgen.twins.twin import Twin


def reference_twin(setup: Setup, group: Group) -> Twin | None:
    """The single-process plain twin on rank 0 (None on the others), starting from the distributed twins' weights.

    A host build: a copy of the one build. A meta-device build: materialised whole from the seed, then every
    parameter replaced by the distributed plain twin's, gathered one whole tensor at a time (a collective: every
    rank calls this), since shards initialised under one seed need not equal the whole tensor's draw (on a CPU mesh
    each shard draws from its rank's generator)."""
    twin = setup.twin(False) if group.rank == 0 else None
    if not on_meta(setup.template.module):
        return twin
    spread = spread_twin(setup, group, False)
    held = {dist_name(n): p.detach() for n, p in spread.model.named_parameters()}
    mine = dict(twin.model.named_parameters()) if twin is not None else {}
    with torch.no_grad():
        for name, (whole,) in each_full(held, keep=twin is not None):
            if twin is not None and whole is not None:
                mine[name].copy_(whole)
            del whole
    return twin


def reference_grads(twin: Twin, setup: Setup, world_size: int) -> dict[str, Tensor | None]:
    """The single-process plain reference on the same global batch: the plain twin's gradients on
    each rank's share, with that rank's generator draws (every rank seeds ``forward_seed``), averaged
    over the shares: what DDP/FSDP2 compute, without sharding. ``twin``: :func:`reference_twin`'s; afterwards it
    holds the averaged gradients (ready for one optimizer step, :meth:`Twin.apply`), and the returned ``grads`` are
    those same tensors (no second copy). Held: the whole model, its gradients and one share's fresh gradients, on
    the rank that calls it (rank 0) only. A gradient that is None on any share is None (never skipped)."""
    model = twin.model
    total: dict[str, Tensor | None] = {}
    for rank in range(world_size):
        model.zero_grad(set_to_none=True)
        fresh = forward_backward(
            twin, shard_batch(setup.batch, rank, world_size), setup.config.forward_seed, clone_grads=False
        ).grads
        for name, g in fresh.items():
            if rank == 0:
                total[name] = None if g is None else g.clone()
            elif (kept := total.get(name)) is not None:
                total[name] = None if g is None else kept.add_(g)
        del fresh
    model.zero_grad(set_to_none=True)
    for name, p in model.named_parameters():
        if (grad := total.get(name)) is not None:
            p.grad = grad.div_(world_size)
    return total


#: What the single-process reference is, said in each of its rows.
REFERENCE_SAID = (
    "reference: the plain model unsharded, in one process (rank 0 alone), your training step run on each "
    "data-parallel share of the global batch with the ranks' seed and the gradients averaged; it does not run your "
    "layout (a sequence-parallel rank draws its dropout masks for its part of the sequence alone, so they differ "
    "from the reference's), hence advisory"
)


def reference_rows(check: str, prefix: str, reference: dict, plain: dict, recompute: dict, rtol, atol) -> list[Row]:
    """Advisory rows (WARN on a miss): each distributed twin vs the single-process reference (:data:`REFERENCE_SAID`
    appended to each row's detail)."""
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
                Role.SHARDING_REFERENCE,
            )
            row.variant, row.on_miss = variant, Status.WARN
            row.__post_init__()  # judged again by results.judge with the advisory on_miss
            row.detail = f"{row.detail}; {REFERENCE_SAID}" if row.detail else REFERENCE_SAID
            rows.append(row)
    return rows


def gradient_rows(setup: Setup, group: Group) -> list[Row]:
    """One forward and backward of the distributed plain, A/A and recompute twins on this rank's share.

    Each twin is dropped after its backward; what is kept of it is its gradients as this rank holds them
    (:func:`reportgen.distributed.full.held_grads`: shards under FSDP), then compared one whole tensor at a time
    (:func:`reportgen.distributed.full.each_full`), so a rank holds one twin and the other twins' gradient shards.

    Returns:
        Per rank: loss and every output leaf (``rank`` column). On rank 0 also: every parameter's
        full gradient (recompute vs plain, with the A/A twin), the A/A row, and (advisory) both
        distributed twins vs the single-process reference.
    """
    rtol, atol = setup.tolerance()
    local, seed = local_share(setup, group), setup.config.forward_seed
    runs, held, drifts = {}, {}, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            twin = spread_twin(setup, group, recompute)
            out = forward_backward(twin, local, seed, clone_grads=False)
            runs[name], held[name] = replace(out, grads={}), held_grads(twin.model)
        state = replicated_state(twin.model, grads=True) | replicated_state(twin.model)
        drifts[name] = measure_sync(state, group, 1, rtol, atol)
        del twin, out, state
    plain, aa, rc = runs["plain"], runs["aa"], runs["recompute"]
    own = [tensor_row(DIST_GRADIENT_PARITY, "loss", plain.loss, rc.loss, rtol, atol, Role.LOSS, aa=aa.loss)]
    for name in dict.fromkeys([*plain.output, *rc.output]):
        p, r, a = plain.output.get(name), rc.output.get(name), aa.output.get(name)
        own.append(tensor_row(DIST_GRADIENT_PARITY, name, p, r, rtol, atol, Role.OUTPUT, aa=a))
    start = reference_twin(setup, group)  # a collective under a meta build
    reference = {} if start is None else reference_grads(start, setup, group.dp_size)
    del start
    grads, advisory, nonzero = [], [], {}
    for name, (p, a, r) in each_full(held["plain"], held["aa"], held["recompute"], keep=group.rank == 0):
        if group.rank == 0:
            item = f"{name}.grad"
            grads.append(tensor_row(DIST_GRADIENT_PARITY, f"{item} (full)", p, r, rtol, atol, Role.PARAM_GRAD, aa=a))
            advisory += reference_rows(
                DIST_GRADIENT_PARITY, "", {item: reference.get(name)}, {item: p}, {item: r}, rtol, atol
            )
            nonzero[name] = None if p is None else torch.tensor(float(bool(p.count_nonzero())))
        del p, a, r
    del held, reference
    rows = [ranked(row, group.rank) for row in [*own, local_gradients_row(setup, local, rtol, atol)]]
    if group.rank != 0:
        return rows
    rows += grads + [aa_row(DIST_GRADIENT_PARITY, rows + grads), zero_gradients_row(DIST_GRADIENT_PARITY, nonzero)]
    rows += [
        sync_row(DIST_GRADIENT_PARITY, name, [drift], group.world_size, rtol, atol, "backward")
        for name, drift in drifts.items()
    ]
    return rows + sorted(advisory, key=lambda row: row.variant != "plain")


def local_gradients_row(setup: Setup, local: tuple, rtol, atol) -> Row:
    """This rank's own gradients before any reduction: the unsharded plain and recompute twins on
    this rank's share (what DDP/FSDP2 compute locally before reducing). A fault that shows on one
    rank only (a rank-dependent branch inside a recomputed block) is named by its rank here, while
    the reduced full gradients only show that something differs.

    Returns:
        One row: tensors outside tolerance (``== 0``), the worst tensor named in ``detail``.
    """
    seed = setup.config.forward_seed
    with raised_in("plain"):  # its twin dropped at once: its gradients stay, then one twin at a time
        plain = forward_backward(setup.twin(False), local, seed, clone_grads=False)
    with raised_in("recompute"):
        rc = forward_backward(setup.twin(True), local, seed, clone_grads=False)
    compared = [
        tensor_row(DIST_GRADIENT_PARITY, f"{n}.grad", plain.grads.get(n), rc.grads.get(n), rtol, atol)
        for n in sorted(set(plain.grads) | set(rc.grads))
    ]
    bad = sorted((r for r in compared if r.status != Status.PASS), key=lambda r: -float(r.extra.get("excess", 0.0)))
    equal = all(bool(r.extra.get("bitwise_equal")) for r in compared)
    detail = (
        f"all {len(compared)} gradients of this rank's share {'bitwise equal' if equal else 'within tolerance'}"
        if not bad
        else f"{len(bad)} of {len(compared)} gradients of this rank's share differ before reduction; "
        f"worst {bad[0].item} (max abs err {bad[0].value:.3g}, {bad[0].detail})"
    )
    extra = {"bitwise_equal": equal, "worst_tensor": bad[0].item if bad else ""}
    item, metric = "local gradients before reduction", "tensors_outside_tolerance"
    return zero_count_row(
        DIST_GRADIENT_PARITY, item, metric, len(bad), "tensors", Role.RANK_LOCAL_GRADS, detail, extra=extra
    )
