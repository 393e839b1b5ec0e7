"""Diagnoses of sharded runs from torch's own words (issue 23, "Diagnoses from torch's own words").

DDP and FSDP say what went wrong in their error messages; these rules match those messages (and
the rank-sync rows), each only under its own strategy (the settings' ``strategy``), and name the cause,
the twin that showed it (a row's ``twin`` column) and the settings that fix it, never one already in
force (the settings' ``distributed``: :func:`reportgen.distributed.wrapping.settings_in_force`) nor one
the strategy refuses. The diagnosis quotes the message of the row that matched
(:func:`reportgen.report.diagnose_unexplained.quote`), so page 1 and the console quote torch instead of
paraphrasing it.
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


def in_force(s: dict[str, Any], key: str) -> Any:
    """The wrapping setting ``key`` (``ddp.static_graph``) the twins ran with, None when the settings do not say."""
    return (s.get("distributed") or {}).get(key)


def either(*options: object) -> str:
    """The options that are offered (``False`` for one that is not), joined by ", or "."""
    return ", or ".join(o for o in options if isinstance(o, str))


def twin_of(row: Row | None) -> str:
    """The twin a row names (its ``twin`` column: plain, recompute), "" when it names none."""
    return "" if row is None else str(row.extra.get("twin") or "")


def ddp(words: tuple[str, ...]) -> Any:
    """``applies``: a DDP run's exception row holds one of ``words``."""
    return lambda rows, s: s.get("strategy") == "ddp" and matching(rows, words) is not None


def drifted(rows: list[Row]) -> Row | None:
    """The first rank-sync row whose twin drifted, a plain twin's first (then the baseline itself is broken)."""
    bad = [r for r in rows if r.role == Role.RANK_SYNC and r.status in BAD]
    return next((r for r in bad if twin_of(r) in BASELINE_TWINS), next(iter(bad), None))


def drift(strategies: tuple[str, ...], plain: bool | None = None) -> Any:
    """``applies``: under one of ``strategies`` a twin's ranks drift (a plain twin's when ``plain``, the recompute
    twin's when not, either when None)."""
    return lambda rows, s: (
        s.get("strategy") in strategies
        and (row := drifted(rows)) is not None
        and plain in (None, twin_of(row) in BASELINE_TWINS)
    )


def ready_twice_cause(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """Why DDP saw a gradient ready twice, from ``find_unused_parameters`` in force."""
    why = {
        True: "find_unused_parameters=True (in force) marks the parameters hidden inside the regions unused in "
        "forward, so they are reduced again when their region's backward runs",
        False: "find_unused_parameters is off, so a parameter takes part more than once in one backward: its module "
        "runs twice (applied twice in one forward, or two forwards before one backward, e.g. micro-batches summed "
        "into one loss)",
    }.get(
        in_force(s, "ddp.find_unused_parameters"),
        "with find_unused_parameters=True (which marks the hidden parameters unused in forward) or a module that runs "
        "more than once per backward, its parameters are reduced twice",
    )
    return (
        "DistributedDataParallel saw a parameter's gradient become ready twice in one backward: reentrant recompute "
        f"(use_reentrant=True) runs each region's backward separately, and {why}"
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


def unfinished_cause(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """Why DDP's previous reduction did not finish, naming the twin that raised."""
    twin = twin_of(matching(group, UNFINISHED) or matching(rows, UNFINISHED))
    lost = {
        "plain": "a parameter the forward never uses: the model breaks DDP by itself, without any recomputation",
        "recompute": "the parameters of a region behind a frozen input under reentrant recompute, which the plain "
        "twin trains",
    }.get(
        twin,
        "a parameter the forward never uses, or the parameters of a region behind a frozen input under "
        "reentrant recompute",
    )
    return (
        f"DistributedDataParallel's previous backward left a gradient bucket unreduced: a parameter got no gradient "
        f"in {f'the {twin}' if twin else 'that'} twin ({lost}), so the ranks kept their own gradients and the next "
        "forward refuses to start"
    )


def unfinished_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """The fix for the twin that raised; both, each with its condition, when no row says which."""
    plain = either(
        "remove the parameter the forward never uses",
        in_force(s, "ddp.find_unused_parameters") is not True and "set distributed.ddp.find_unused_parameters=true",
    )
    recompute = either(
        s.get("mode") != "non_reentrant" and "use recompute=non_reentrant",
        "make the region's input require grad (model.enable_input_require_grads())",
    )
    twin = twin_of(matching(group, UNFINISHED) or matching(rows, UNFINISHED))
    return {"plain": plain, "recompute": recompute}.get(
        twin, f"if the plain twin raised: {plain}; if only the recompute twin raised: {recompute}"
    )


def fsdp_metadata_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """The units and resharding settings of this FSDP strategy that fix a recomputation seeing other shapes."""
    fsdp1 = s.get("strategy") == "fsdp1"
    return (
        either(
            not str(in_force(s, "fsdp.units") or "").endswith("(the recompute targets)")
            and "make each recomputed block its own FSDP unit with the recompute wrapper inside it "
            "(distributed.fsdp.units = the recompute targets, the default)",
            fsdp1
            and in_force(s, "fsdp1.sharding_strategy") != "SHARD_GRAD_OP"
            and "distributed.fsdp1.sharding_strategy=SHARD_GRAD_OP (gathered parameters kept for backward)",
            not fsdp1
            and in_force(s, "fsdp.reshard_after_forward") is not False
            and "distributed.fsdp.reshard_after_forward=false",
        )
        or "leave the region out of recompute.targets"
    )


def plain_drift_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """Make plain DDP correct first, with ``find_unused_parameters=true`` only when it is not in force."""
    found = in_force(s, "ddp.find_unused_parameters") is not True and "distributed.ddp.find_unused_parameters=true"
    said = either(found, "remove parameters the forward never uses")
    return f"make plain distributed training correct first ({said}), then rerun"


def outside_units_cause(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """Ranks drift under FSDP: a parameter no unit holds, in the twin that drifted."""
    twin = twin_of(drifted(group) or drifted(rows))
    return (
        f"the {twin} twin's ranks end a step with different parameters: a parameter outside every FSDP unit (fully_shard "
        "applied to some modules but not to the one that holds it, nor to the root) stays a plain tensor on each rank, "
        "nothing reduces its gradient, and each rank steps it with its own"
        + (
            "; the plain twin drifts, so the baseline itself is broken under this wrapping"
            if twin in BASELINE_TWINS
            else ""
        )
    )


def outside_units_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """Wrap those parameters in a unit; fully_shard the root only where reportgen does not already."""
    if s.get("strategy") == "custom":
        return (
            "in your distributed.wrap function, wrap them in a unit (fully_shard the module that holds them), or "
            "fully_shard the root after the units"
        )
    return "wrap them in a unit: add the module that holds them to distributed.fsdp.units (the root is sharded already)"


#: ``(name, applies, cause, fix, words)``: the rules, in order; ``cause``/``fix`` a sentence, or
#: ``(the check's rows, every row, settings) -> sentence``; ``words`` select the row to quote.
RULES: tuple[tuple[str, Any, Any, Any, tuple[str, ...]], ...] = (
    ("DDP: parameter ready twice", ddp(READY_TWICE), ready_twice_cause, ready_twice_fix, READY_TWICE),
    ("DDP: reduction not finished", ddp(UNFINISHED), unfinished_cause, unfinished_fix, UNFINISHED),
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
        drift(("ddp",), plain=True),
        "the plain twin's ranks end a step with different parameters: its gradients were not all-reduced (a parameter "
        "without gradient left DDP's bucket unreduced), so the baseline itself is broken under this wrapping",
        plain_drift_fix,
        (),
    ),
    (
        "recompute ranks drift",
        drift(("ddp",), plain=False),
        "the recompute twin's ranks drift apart after a step while the plain twin's stay in sync: some parameter got no "
        "gradient under recompute, so DDP never all-reduced its bucket and each rank stepped with its own gradients",
        "use recompute=non_reentrant (use_reentrant=False), or make each recomputed region's input require grad",
        (),
    ),
    (
        "FSDP: parameters outside every unit",
        drift(("fsdp2", "fsdp1", "custom")),
        outside_units_cause,
        outside_units_fix,
        (),
    ),
)


def single_process_passed(rows: list[Row]) -> bool:
    """True when the single-process parity checks ran and every row of them passed (or was not judged)."""
    judged = [r for r in rows if r.check in SINGLE_PROCESS and r.comparator]
    return bool(judged) and all(r.status == Status.PASS for r in judged)


def rank_failed_fix(group: list[Row], rows: list[Row], s: dict[str, Any]) -> str:
    """The fix for a failed rank: "run it alone" only when that would tell something new."""
    if single_process_passed(rows):
        return (
            "fix what the named rank reports (its ERROR row quotes torch's message); the single-process checks "
            "passed, so the fault lies in how the twins are spread over the ranks (distributed.strategy and its "
            "settings), not in the model alone"
        )
    return "fix what the named rank reports (run it alone with distributed.world_size=1 first), then rerun"
