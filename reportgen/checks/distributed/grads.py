"""Gradient parity of the sharded twins (a part of :mod:`reportgen.checks.distributed.check`): each rank's
loss, outputs and own gradients before reduction, then every parameter's full gradient, recompute vs
the distributed plain twin; and the single-process plain reference on the same global batch that
shows sharding's own effect (advisory, also read by the step part)."""

from __future__ import annotations

from torch import Tensor

from reportgen.checks.distributed.cost import local_share
from reportgen.config import DIST_GRADIENT_PARITY
from reportgen.distributed.full import full_grads
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
from reportgen.twins.twin import Twin


def _mean(parts: list[Tensor | None], world_size: int) -> Tensor | None:
    """The float64 mean of every rank's share (summed in rank order), in the shares' dtype; None when any is None."""
    present = [p for p in parts if p is not None]
    if not present or len(present) < len(parts):
        return None
    total = sum((p.double() for p in present[1:]), present[0].double())
    return (total / world_size).to(present[0].dtype)


def reference_grads(setup: Setup, world_size: int) -> tuple[Twin, dict]:
    """The single-process plain reference on the same global batch: the plain twin's gradients on
    each rank's share, with that rank's generator draws (every rank seeds ``forward_seed``), averaged
    over the shares: what DDP/FSDP2 compute, without sharding. Returns ``(twin, grads)``; the
    twin holds the averaged gradients (ready for one optimizer step, :meth:`Twin.apply`)."""
    twin, per_rank = setup.twin(False), []
    model = twin.model
    for rank in range(world_size):
        model.zero_grad(set_to_none=True)
        per_rank.append(
            forward_backward(twin, shard_batch(setup.batch, rank, world_size), setup.config.forward_seed).grads
        )
    grads: dict[str, Tensor | None] = {}
    for name in per_rank[0]:
        parts = [g.get(name) for g in per_rank]  # None on any share: None (never skipped)
        grads[name] = _mean(parts, world_size)
    for name, p in model.named_parameters():
        p.grad = None if (grad := grads.get(name)) is None else grad.clone()
    return twin, grads


def reference_rows(check: str, prefix: str, reference: dict, plain: dict, recompute: dict, rtol, atol) -> list[Row]:
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
                Role.SHARDING_REFERENCE,
            )
            row.variant, row.on_miss = variant, Status.WARN
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
    local, seed = local_share(setup, group), setup.config.forward_seed
    runs, drifts = {}, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            twin = spread_twin(setup, group, recompute)
            out = forward_backward(twin, local, seed)
            runs[name] = (out, full_grads(twin.model))  # collective under FSDP: every rank, same order
        held = {f"{n}.grad": g for n, g in runs[name][1].items() if g is not None}
        drifts[name] = measure_sync(held | replicated_state(twin.model), group, 1, rtol, atol)
    (plain, plain_g), (aa, aa_g), (rc, rc_g) = runs["plain"], runs["aa"], runs["recompute"]
    own = [tensor_row(DIST_GRADIENT_PARITY, "loss", plain.loss, rc.loss, rtol, atol, Role.LOSS, aa=aa.loss)]
    for name in dict.fromkeys([*plain.output, *rc.output]):
        p, r, a = plain.output.get(name), rc.output.get(name), aa.output.get(name)
        own.append(tensor_row(DIST_GRADIENT_PARITY, name, p, r, rtol, atol, Role.OUTPUT, aa=a))
    rows = [ranked(row, group.rank) for row in [*own, local_gradients_row(setup, local, rtol, atol)]]
    if group.rank != 0:
        return rows
    grads = []
    for name in sorted(set(plain_g) | set(rc_g)):
        p, r, a = plain_g.get(name), rc_g.get(name), aa_g.get(name)
        grads.append(tensor_row(DIST_GRADIENT_PARITY, f"{name}.grad (full)", p, r, rtol, atol, Role.PARAM_GRAD, aa=a))
    _, reference = reference_grads(setup, group.world_size)
    rows += grads + [aa_row(DIST_GRADIENT_PARITY, rows + grads), zero_gradients_row(DIST_GRADIENT_PARITY, plain_g)]
    rows += [
        sync_row(DIST_GRADIENT_PARITY, name, [drift], group.world_size, rtol, atol, "backward")
        for name, drift in drifts.items()
    ]
    return rows + reference_rows(
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
    seed = setup.config.forward_seed
    with raised_in("plain"):
        plain = forward_backward(setup.twin(False), local, seed)
    with raised_in("recompute"):
        rc = forward_backward(setup.twin(True), local, seed)
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
