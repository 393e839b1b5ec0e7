"""Diagnoses of sharded runs from torch's own words: rules that match DDP's and FSDP's error messages (and the
rank-sync rows) under their own layout (the strategy, and the named mesh's dimensions: no FSDP cause without
FSDP), and offer only fixes not already in force (:func:`reportgen.distributed.wrapping.settings_in_force`) nor
refused by the strategy."""

from __future__ import annotations

from typing import Any

from reportgen.config import GRADIENT_PARITY, STATE_PARITY, STEP_PARITY
from reportgen.report.diagnose_unexplained import BAD
from reportgen.results import BASELINE_TWINS, Role, Row, Status

#: What DDP says when a parameter's gradient hook fires twice in one backward (torch/csrc/distributed/c10d/reducer.cpp).
READY_TWICE: tuple[str, ...] = ("mark a variable ready only once", "marked ready only once", "marked as ready twice")
READY_TWICE += ("has been marked as ready twice",)
#: What DDP says when the previous backward left a bucket unreduced (a parameter got no gradient).
UNFINISHED = ("Expected to have finished reduction in the prior iteration",)
#: What torch.utils.checkpoint says when a recomputation sees other tensors than the forward did.
METADATA = ("different metadata", "Recomputed values for the following tensors")
#: Single-process checks: when they passed, a rank's error comes from the sharding.
SINGLE_PROCESS = (GRADIENT_PARITY, STEP_PARITY, STATE_PARITY)


def matching(rows: list[Row], words: tuple[str, ...]) -> Row | None:
    """The first bad exception row (of a rank) whose message holds one of ``words``."""
    bad = (r for r in rows if r.role == Role.EXCEPTION and r.status in BAD)
    return next((r for r in bad if any(w.lower() in r.detail.lower() for w in words)), None)


def in_force(s: dict[str, Any], key: str) -> Any:
    """The wrapping setting ``key`` (``ddp.static_graph``) the twins ran with, None when the settings do not say."""
    return (s.get("distributed") or {}).get(key)


def either(*options: object) -> str:
    """The options offered (a ``False`` among them is one not offered: in force, or refused), joined by ", or "."""
    return ", or ".join(o for o in options if isinstance(o, str))


def ddp(words: tuple[str, ...]) -> Any:
    """``applies``: a DDP run's exception row holds one of ``words``."""
    return lambda rows, s: s.get("strategy") == "ddp" and matching(rows, words) is not None


def drifted(rows: list[Row]) -> str:
    """The twin whose ranks drifted (a rank-sync row; a plain twin first: its baseline is broken), else ""."""
    twins = [str(r.extra.get("twin")) for r in rows if r.role == Role.RANK_SYNC and r.status in BAD]
    return next((t for t in twins if t in BASELINE_TWINS), twins[0] if twins else "")


def drift(strategies: tuple[str, ...], *twins: str) -> Any:
    """``applies``: under one of ``strategies`` the ranks of one of ``twins`` drift (of any twin when none given)."""
    return lambda rows, s: s.get("strategy") in strategies and bool(t := drifted(rows)) and (not twins or t in twins)


def sharded_by_fsdp(s: dict[str, Any]) -> bool:
    """FSDP is in the layout: ``strategy=fsdp2``/``fsdp1``, or the user's own function on a mesh with a
    ``dp_shard`` dimension (FSDP's, as torchtitan names it) or on the unnamed 1-D mesh (which ``fully_shard`` may
    use: nothing says otherwise)."""
    strategy, mesh = s.get("strategy"), s.get("mesh") or {}
    return strategy in ("fsdp2", "fsdp1") or (strategy == "custom" and (not mesh or "dp_shard" in mesh))


def mesh_said(s: dict[str, Any]) -> str:
    """The named mesh in force as page 1 writes it (``dp_replicate=2 × tp=2``)."""
    return " × ".join(f"{name}={degree}" for name, degree in (s.get("mesh") or {}).items())


def ready_twice_cause(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """Why DDP saw a gradient ready twice: ``find_unused_parameters`` when it is in force, else a module run twice."""
    why = (
        "find_unused_parameters=True (in force) marks the parameters hidden inside the regions unused in forward"
        if in_force(s, "ddp.find_unused_parameters")
        else "a parameter takes part more than once in one backward: its module is applied twice in one forward, or "
        "two forwards run before one backward (e.g. micro-batches summed into one loss)"
    )
    return (
        "DistributedDataParallel saw a parameter's gradient become ready twice in one backward: reentrant recompute "
        f"(use_reentrant=True) runs each region's backward separately, and {why}, so it is reduced twice"
    )


def ready_twice_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """The settings that fix a gradient ready twice, less those in force."""
    return (
        either(
            not in_force(s, "ddp.static_graph")
            and "set distributed.ddp.static_graph=true (the graph is the same every iteration)",
            s.get("mode") != "non_reentrant" and "use recompute=non_reentrant (use_reentrant=False)",
            in_force(s, "ddp.find_unused_parameters") is not False
            and "distributed.ddp.find_unused_parameters=false when every parameter gets a gradient",
        )
        or "run each module once per backward (one forward per backward, no module applied twice)"
    )


def unfinished_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """The fix for the twin that raised (its row's ``twin``); both, each with its condition, when no row says which."""
    plain = either(
        "remove the parameter the forward never uses",
        not in_force(s, "ddp.find_unused_parameters") and "set distributed.ddp.find_unused_parameters=true",
    )
    recompute = either(
        s.get("mode") != "non_reentrant" and "use recompute=non_reentrant",
        "make the region's input require grad (model.enable_input_require_grads())",
    )
    raised = matching(group, UNFINISHED) or matching(rows, UNFINISHED)
    return {"plain": plain, "recompute": recompute}.get(
        str(raised.extra.get("twin")) if raised else "",
        f"if the plain twin raised: {plain}; if only the recompute twin raised: {recompute}",
    )


def fsdp_metadata_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """This FSDP strategy's unit and resharding settings that fix a recomputation seeing other shapes, less those in
    force (``fsdp.reshard_after_forward`` is FSDP2's; FSDP1 says it with its sharding strategy)."""
    fsdp1 = s.get("strategy") == "fsdp1"
    return (
        either(
            not str(in_force(s, "fsdp.units") or "").endswith("(the recompute targets)")
            and "make each recomputed block its own FSDP unit with the recompute wrapper inside it "
            "(distributed.fsdp.units = the recompute targets, the default)",
            fsdp1
            and in_force(s, "fsdp1.sharding_strategy") != "SHARD_GRAD_OP"
            and "distributed.fsdp1.sharding_strategy=SHARD_GRAD_OP",
            not fsdp1
            and in_force(s, "fsdp.reshard_after_forward") is not False
            and "distributed.fsdp.reshard_after_forward=false",
        )
        or "leave the region out of recompute.targets"
    )


#: ``(name, applies, cause, fix, words)``: the rules, in order; ``cause`` and ``fix`` each a sentence, or
#: ``(the check's rows, every row, settings) -> sentence``; ``words`` select the row to quote.
RULES: tuple[tuple[str, Any, Any, Any, tuple[str, ...]], ...] = (
    ("DDP: parameter ready twice", ddp(READY_TWICE), ready_twice_cause, ready_twice_fix, READY_TWICE),
    (
        "DDP: reduction not finished",
        ddp(UNFINISHED),
        "DistributedDataParallel's previous backward left a gradient bucket unreduced: a parameter got no gradient in "
        "the twin that raised (the plain twin: a parameter the forward never uses; the recompute twin only: the "
        "parameters of a region behind a frozen input under reentrant recompute), so the ranks kept their own "
        "gradients and the next forward refuses to start",
        unfinished_fix,
        UNFINISHED,
    ),
    (
        "FSDP: recomputed metadata differs",
        lambda rows, s: str(s.get("strategy", "")).startswith("fsdp") and matching(rows, METADATA) is not None,
        "the recomputation under FSDP saw tensors of another shape or dtype than the forward: a unit's parameters were "
        "resharded (or not yet gathered) when the region ran again, which happens when the recompute wrapper and the "
        "FSDP unit are nested the other way round",
        fsdp_metadata_fix,
        METADATA,
    ),
    (
        "plain ranks drift",
        drift(("ddp",), *BASELINE_TWINS),
        "the plain twin's ranks end a step with different parameters: its gradients were not all-reduced (a parameter "
        "without gradient left DDP's bucket unreduced), so the baseline itself is broken under this wrapping",
        lambda group, rows, s: (
            "make plain distributed training correct first ("
            + either(
                not in_force(s, "ddp.find_unused_parameters") and "distributed.ddp.find_unused_parameters=true",
                "remove parameters the forward never uses",
            )
            + "), then rerun"
        ),
        (),
    ),
    (
        "recompute ranks drift",
        drift(("ddp",), "recompute"),
        "the recompute twin's ranks drift apart after a step while the plain twin's stay in sync: some parameter got no "
        "gradient under recompute, so DDP never all-reduced its bucket and each rank stepped with its own gradients",
        "use recompute=non_reentrant (use_reentrant=False), or make each recomputed region's input require grad",
        (),
    ),
    (
        "FSDP: parameters outside every unit",
        lambda rows, s: sharded_by_fsdp(s) and bool(drifted(rows)),
        lambda group, rows, s: (
            f"the {drifted(group) or drifted(rows)} twin's ranks end a step with different "
            "parameters: a parameter outside every FSDP unit (fully_shard applied to some modules but not to the one that "
            "holds it, nor to the root) stays a plain tensor on each rank, nothing reduces its gradient, and each rank "
            "steps it with its own"
        ),
        lambda group, rows, s: (
            "in your distributed.wrap, wrap them in a unit (fully_shard the module that holds "
            "them), or fully_shard the root after the units"
            if s.get("strategy") == "custom"
            else "wrap them in a unit: add the module that holds them to distributed.fsdp.units (the root is sharded "
            "already)"
        ),
        (),
    ),
    (
        "ranks drift without FSDP",
        lambda rows, s: s.get("strategy") == "custom" and not sharded_by_fsdp(s) and bool(drifted(rows)),
        lambda group, rows, s: (
            f"the {drifted(group) or drifted(rows)} twin's ranks end a step with different values of a tensor they "
            f"should hold alike (mesh {mesh_said(s)}, no FSDP): a gradient your distributed.wrap never reduces over "
            "the data-parallel dimension (dp_replicate), or tensor-parallel peers that computed on different inputs"
        ),
        "in your distributed.wrap, reduce every replicated parameter's gradient over mesh['dp_replicate'] (e.g. "
        "torch.distributed._composable.replicate, or DistributedDataParallel with device_mesh=mesh['dp_replicate']) "
        "and give tensor-parallel peers the same input (reportgen splits the batch over dp_replicate and dp_shard only)",
        (),
    ),
)


def rank_failed_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """The fix for a failed rank: "run it alone" only when that would tell something new (the single-process
    parity checks did not all run and pass)."""
    judged = [r for r in rows if r.check in SINGLE_PROCESS and r.comparator]
    if judged and all(r.status == Status.PASS for r in judged):
        return (
            "fix what the named rank reports (its ERROR row quotes torch's message); the single-process checks "
            "passed, so the fault lies in how the twins are spread over the ranks (distributed.strategy and its "
            "settings), not in the model alone"
        )
    return "fix what the named rank reports (run it alone with distributed.world_size=1 first), then rerun"
