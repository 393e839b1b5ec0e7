"""Diagnoses of sharded runs from torch's own words (issue 23, "Diagnoses from torch's own words").

DDP and FSDP say what went wrong in their error messages; these rules match those messages (and
the rank-sync rows) and name the cause and the setting that fixes it. :func:`quote` gives the
message of the row that matched, so page 1 and the console quote torch instead of paraphrasing it.
"""

from __future__ import annotations

from typing import Any

from reportgen.config import GRADIENT_PARITY, STATE_PARITY, STEP_PARITY
from reportgen.report.diagnose_unexplained import BAD
from reportgen.results import BASELINE_TWINS, Role, Row, Status

#: What DDP says when a parameter's gradient hook fires twice in one backward (torch/csrc/distributed/c10d/reducer.cpp).
READY_TWICE = (
    "mark a variable ready only once",
    "marked ready only once",
    "marked as ready twice",
    "has been marked as ready twice",
)
#: What DDP says when the previous backward left a bucket unreduced (a parameter got no gradient).
UNFINISHED = ("Expected to have finished reduction in the prior iteration",)
#: What torch.utils.checkpoint says when a recomputation sees other tensors than the forward did.
METADATA = ("different metadata", "Recomputed values for the following tensors")
#: Single-process checks: when they passed, a rank's error comes from the sharding.
SINGLE_PROCESS = (GRADIENT_PARITY, STEP_PARITY, STATE_PARITY)


def matching(rows: list[Row], words: tuple[str, ...]) -> Row | None:
    """The first bad exception row (of a rank) whose message holds one of ``words``."""
    return next(
        (
            r
            for r in rows
            if r.role == Role.EXCEPTION and r.status in BAD and any(w.lower() in r.detail.lower() for w in words)
        ),
        None,
    )


def quote(row: Row) -> str:
    """``raised by the plain twin on rank 1: "<torch's first sentence>"``."""
    kind = row.extra.get("exception_type")
    marker = f"{kind}: " if kind and f"{kind}: " in row.detail else ": "  # the message starts after the type
    message = row.detail.split(marker, 1)[-1]
    first = message.split(". ")[0].strip().rstrip(".")[:300]
    twin, rank = row.extra.get("twin"), row.extra.get("rank")
    who = " ".join(x for x in (f"the {twin} twin" if twin else "", f"on rank {rank}" if rank is not None else "") if x)
    return f'{who or "a rank"} raised: "{first}"'


def ready_twice(rows: list[Row], s: dict[str, Any]) -> bool:
    return matching(rows, READY_TWICE) is not None


def unfinished(rows: list[Row], s: dict[str, Any]) -> bool:
    return matching(rows, UNFINISHED) is not None


def fsdp_metadata(rows: list[Row], s: dict[str, Any]) -> bool:
    return str(s.get("strategy", "")).startswith("fsdp") and matching(rows, METADATA) is not None


def baseline_drift(rows: list[Row], s: dict[str, Any]) -> bool:
    return any(r.role == Role.RANK_SYNC and r.status in BAD and r.extra.get("twin") in BASELINE_TWINS for r in rows)


def recompute_drift(rows: list[Row], s: dict[str, Any]) -> bool:
    return any(r.role == Role.RANK_SYNC and r.status in BAD and r.extra.get("twin") == "recompute" for r in rows)


#: ``(name, applies, cause, fix, words)``: the rules, in order; ``words`` select the row to quote.
RULES: tuple[tuple[str, Any, str, str, tuple[str, ...]], ...] = (
    (
        "DDP: parameter ready twice",
        ready_twice,
        "DistributedDataParallel saw a parameter's gradient become ready twice in one backward: reentrant recompute "
        "(use_reentrant=True) runs each region's backward separately, so with find_unused_parameters=True (which marks "
        "the hidden parameters unused in forward) or a module applied more than once per forward, its parameters are "
        "reduced twice",
        "set distributed.ddp.static_graph=true (the graph is the same every iteration), or use recompute=non_reentrant "
        "(use_reentrant=False), or distributed.ddp.find_unused_parameters=false when every parameter gets a gradient",
        READY_TWICE,
    ),
    (
        "DDP: reduction not finished",
        unfinished,
        "DistributedDataParallel's previous backward left a gradient bucket unreduced: a parameter got no gradient in "
        "that twin (a parameter the forward never uses, or the parameters of a region behind a frozen input under "
        "reentrant recompute), so the ranks kept their own gradients and the next forward refuses to start",
        "if the plain twin raised, the model breaks DDP by itself: set distributed.ddp.find_unused_parameters=true or "
        "remove the unused parameter; if only the recompute twin raised, use recompute=non_reentrant or make the "
        "region's input require grad (model.enable_input_require_grads())",
        UNFINISHED,
    ),
    (
        "FSDP: recomputed metadata differs",
        fsdp_metadata,
        "the recomputation under FSDP saw tensors of another shape or dtype than the forward: a unit's parameters were "
        "resharded (or not yet gathered) when the region ran again, which happens when the recompute wrapper and the "
        "FSDP unit are nested the other way round",
        "make each recomputed block its own FSDP unit with the recompute wrapper inside it (distributed.fsdp.units = the "
        "recompute targets, the default), or distributed.fsdp.reshard_after_forward=false",
        METADATA,
    ),
    (
        "plain ranks drift",
        baseline_drift,
        "the plain twin's ranks end a step with different parameters: its gradients were not all-reduced (a parameter "
        "without gradient left DDP's bucket unreduced), so the baseline itself is broken under this wrapping",
        "make plain distributed training correct first (distributed.ddp.find_unused_parameters=true, or remove "
        "parameters the forward never uses), then rerun",
        (),
    ),
    (
        "recompute ranks drift",
        recompute_drift,
        "the recompute twin's ranks drift apart after a step while the plain twin's stay in sync: some parameter got no "
        "gradient under recompute, so DDP never all-reduced its bucket and each rank stepped with its own gradients",
        "use recompute=non_reentrant (use_reentrant=False), or make each recomputed region's input require grad",
        (),
    ),
)


def single_process_passed(rows: list[Row]) -> bool:
    """True when the single-process parity checks ran and every row of them passed (or was not judged)."""
    judged = [r for r in rows if r.check in SINGLE_PROCESS and r.comparator]
    return bool(judged) and all(r.status == Status.PASS for r in judged)


def rank_failed_fix(rows: list[Row]) -> str:
    """The fix for a failed rank: "run it alone" only when that would tell something new."""
    if single_process_passed(rows):
        return (
            "fix what the named rank reports (its ERROR row quotes torch's message); the single-process checks "
            "passed, so the fault lies in how the twins are spread over the ranks (distributed.strategy and its "
            "settings), not in the model alone"
        )
    return "fix what the named rank reports (run it alone with distributed.world_size=1 first), then rerun"
