"""Cost of the sharded twins on every rank: saved activation bytes and the step peak per rank and
the maximum over ranks, and warm step time with the slowest rank setting each step's pace (parts
of :mod:`reportgen.checks.distributed.check`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from reportgen.config import DIST_MEMORY, DIST_TIME, MemoryConfig, TimingConfig
from reportgen.distributed.launch import Group, max_over_ranks, shard_batch
from reportgen.distributed.ranks import ranked
from reportgen.distributed.wrapping import spread_twin
from reportgen.memory.peak import warm_step_peak
from reportgen.memory.saved import saved_activation_bytes
from reportgen.results import Role, Row, Status
from reportgen.results.bootstrap import bootstrap_ratio_ci
from reportgen.results.raised import raised_in
from reportgen.twins.setup import Setup
from reportgen.twins.twin import TrainStep, timed


def local_share(setup: Setup, group: Group) -> tuple:
    """This rank's share of the setup's fixed global batch (its data-parallel rank's: TP/CP peers share one)."""
    return shard_batch(setup.batch, group.dp_rank, group.dp_size)


def memory_rows(setup: Setup, group: Group) -> list[Row]:
    """Memory of each rank, in runs of their own: bytes autograd saves for backward (forward and loss on
    the rank's share) and the peak of live tensor bytes in one warm training step
    (:func:`reportgen.memory.peak.warm_step_peak`, torch's MemTracker; on CUDA the allocator's peaks beside
    it). On rank 0 the maximum over ranks: recompute's worst-rank peak must not exceed plain's
    (``memory.peak_on_miss`` on a miss) and it must save less (advisory, WARN)."""
    local, paths = local_share(setup, group), [w.path for w in setup.wrapped]
    seed = setup.config.forward_seed
    measured = {}
    for variant, recompute in (("plain", False), ("recompute", True)):
        with raised_in(variant):  # an exception names the twin that raised
            model = spread_twin(setup, group, recompute).model
            measured[variant] = saved_activation_bytes(model, local, setup.training_step, seed, paths).total_bytes
    rows = []
    for variant, value in measured.items():
        said = f"bytes autograd keeps for backward on rank {group.rank} ({variant} twin)"
        item = f"saved activations ({variant})"
        rows.append(
            ranked(_figure(DIST_MEMORY, item, Role.RANK_SAVED_TOTAL, said, SAVED, value, "B", variant), group.rank)
        )
    peaks = {}
    for variant, recompute in (("plain", False), ("recompute", True)):
        with raised_in(variant):
            peaks[variant] = warm_step_peak(TrainStep(spread_twin(setup, group, recompute), local, seed), warm_steps=1)
    for variant, peak in peaks.items():
        at = peak.phase + (f" of {peak.module}" if peak.module else "")
        said = f"live tensor bytes at the peak of a warm step on rank {group.rank} ({variant} twin), reached in {at}"
        row = _figure(
            DIST_MEMORY, f"step peak ({variant})", Role.RANK_STEP_PEAK, said, PEAK, peak.peak_bytes, "B", variant
        )
        row.extra = {"phase": peak.phase, **(peak.cuda or {})}
        rows.append(ranked(row, group.rank))
    figures = [*measured.values(), *(peak.peak_bytes for peak in peaks.values())]  # saved, then peak; plain first
    worst = max_over_ranks([float(v) for v in figures], group)
    if group.rank != 0:
        return rows
    section: MemoryConfig = setup.config.memory
    on_miss = section.peak_on_miss
    return rows + [
        *max_pair_rows(
            "step peak",
            PEAK,
            Role.MAX_RANK_STEP_PEAK,
            worst[2],
            worst[3],
            "<=",
            on_miss,
            f"the largest plain step peak of the {group.world_size} ranks",
            f"recompute's step peak on its worst rank is {worst[3]:.0f} B against {worst[2]:.0f} B plain "
            "(torch's MemTracker: live tensor bytes through forward, backward and the optimizer step)",
        ),
        *max_pair_rows(
            "saved activations",
            SAVED,
            Role.MAX_RANK_SAVED_TOTAL,
            worst[0],
            worst[1],
            "<",
            Status.WARN,
            f"the largest plain twin's saved bytes of the {group.world_size} ranks",
            f"recompute keeps {worst[1]:.0f} B on its worst rank against {worst[0]:.0f} B plain",
        ),
    ]


def max_pair_rows(
    item: str,
    metric: str,
    role: str,
    plain: float,
    recompute: float,
    comparator: str,
    on_miss: str,
    plain_detail: str,
    recompute_detail: str,
) -> list[Row]:
    """The plain/recompute row pair of one memory figure's maximum over ranks (rank 0): the plain
    maximum stated (INFO), the recompute maximum judged against it.

    Args:
        item: the figure, e.g. ``"step peak"`` (items ``"<item>, max over ranks (<variant>)"``).
        metric: the metric name of both rows (bytes, e.g. ``peak_live_bytes``).
        role: the rows' role (:attr:`Role.MAX_RANK_STEP_PEAK`, :attr:`Role.MAX_RANK_SAVED_TOTAL`).
        plain, recompute: each twin's maximum over ranks, bytes.
        comparator: how recompute must compare with plain (``"<="``, ``"<"``).
        on_miss: the recompute row's status when missed (FAIL, or WARN when advisory).
        plain_detail, recompute_detail: each row's sentence.

    Returns:
        ``[plain row, recompute row]``.
    """
    return [
        _figure(DIST_MEMORY, f"{item}, max over ranks (plain)", role, plain_detail, metric, plain, "B", "plain"),
        Row.measured(
            DIST_MEMORY,
            f"{item}, max over ranks (recompute)",
            metric,
            recompute,
            "B",
            comparator=comparator,
            threshold_value=plain,
            threshold=f"{comparator} {plain:.0f} B (plain, max over ranks)",
            on_miss=on_miss,
            role=role,
            detail=recompute_detail,
        ),
    ]


#: The metrics of saved-activation bytes and of the step peak.
SAVED, PEAK = "saved_activation_bytes", "peak_live_bytes"


def _figure(check: str, item: str, role: str, detail: str, metric: str, value: float, unit: str, variant: str) -> Row:
    """An INFO row of one twin's figure (``value`` in ``unit``), on one rank or the maximum over ranks."""
    return Row.fact(check, item, role, detail, metric=metric, value=float(value), unit=unit, variant=variant)


def time_rows(setup: Setup, group: Group) -> list[Row]:
    """Warm training steps of the distributed plain and recompute twins, interleaved; each step's time is
    the maximum over ranks (the slowest rank sets the pace). Rows: each rank's median (per rank) and,
    on rank 0, the medians of the per-step maxima and the paired overhead ratio with its bootstrap CI
    (:func:`reportgen.results.bootstrap.bootstrap_ratio_ci`, ``timing.bootstrap_samples``), judged ``ci<=``
    against ``timing.max_overhead_ratio`` when that is set (INFO otherwise)."""
    tc: TimingConfig = setup.config.timing
    local = local_share(setup, group)
    steps: dict[str, Callable[[], None]] = {
        variant: TrainStep(spread_twin(setup, group, recompute), local, setup.config.forward_seed)
        for variant, recompute in (("plain", False), ("recompute", True))
    }
    times: dict[str, list[float]] = {"plain": [], "recompute": []}
    for index in range(tc.warmup_steps + tc.measured_steps):
        for variant, step in steps.items():
            with raised_in(variant):  # an exception names the twin that raised
                took = timed(step, group.device)
            if index >= tc.warmup_steps:
                times[variant].append(took)
    rows = []
    for variant, ms in times.items():
        said, median = f"median of {len(ms)} warm steps on rank {group.rank}", statistics.median(ms)
        row = _figure(
            DIST_TIME, f"median step ({variant})", Role.RANK_STEP, said, "step_time_ms", median, "ms", variant
        )
        rows.append(ranked(row, group.rank))
    worst = {variant: max_over_ranks(ms, group) for variant, ms in times.items()}
    if group.rank != 0:
        return rows
    for variant, ms in worst.items():
        said, median = f"median over {len(ms)} steps of the slowest rank's time", statistics.median(ms)
        item = f"median step, max over ranks ({variant})"
        rows.append(_figure(DIST_TIME, item, Role.MAX_RANK_STEP, said, "step_time_ms", median, "ms", variant))
    ratio, low, high = bootstrap_ratio_ci(worst["plain"], worst["recompute"], tc.bootstrap_samples)
    bound = tc.max_overhead_ratio
    detail = (
        f"median over {len(worst['plain'])} interleaved rounds of recompute/plain, each step timed as the slowest of "
        f"{group.world_size} ranks; paired-bootstrap 95% CI {low:.3f}–{high:.3f}"
    )
    threshold, comparator, limit = ("", "", math.nan) if bound is None else (f"<= {bound}", "ci<=", float(bound))
    rows.append(
        Row.measured(
            DIST_TIME,
            "overhead ratio (slowest rank per step)",
            "overhead_ratio",
            ratio,
            "ratio",
            comparator=comparator,
            threshold_value=limit,
            threshold=threshold,
            role=Role.MAX_RANK_OVERHEAD,
            detail=detail,
            extra={"ci_low": low, "ci_high": high, "rounds": len(worst["plain"])},
        )
    )
    return rows
