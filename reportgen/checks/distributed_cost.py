"""Cost of the sharded twins on every rank: saved activation bytes and the step peak per rank and
the maximum over ranks, and warm step time with the slowest rank setting each step's pace (parts
of ``reportgen.checks.distributed``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from reportgen.config import DIST_MEMORY, DIST_TIME, MemoryConfig, TimingConfig
from reportgen.distributed.launch import Group, max_over_ranks, shard_batch
from reportgen.distributed.ranks import ranked, twin
from reportgen.distributed.wrapping import spread_twin
from reportgen.memory.peak import warm_step_peak
from reportgen.memory.saved import make_train_step, saved_activation_bytes
from reportgen.results import Row, Status
from reportgen.results.bootstrap import bootstrap_ratio_ci
from reportgen.twins.setup import Setup

ROLE_RANK_TOTAL = "rank_saved_total"  #: saved activation bytes of one rank
ROLE_RANK_STEP = "rank_step"  #: one rank's median warm step time
ROLE_MAX_SAVED = "max_rank_saved_total"  #: saved bytes of the worst rank (plain, recompute)
ROLE_RANK_PEAK = "rank_step_peak"  #: live tensor bytes at the peak of one rank's warm step
ROLE_MAX_PEAK = "max_rank_step_peak"  #: the step peak of the worst rank (plain, recompute)
ROLE_MAX_STEP = "max_rank_step"  #: median over steps of the slowest rank's step time
ROLE_MAX_OVERHEAD = "max_rank_overhead"  #: paired recompute/plain ratio of the slowest rank's step times


def local_share(setup: Setup, group: Group) -> tuple:
    """This rank's share of the setup's fixed global batch."""
    return shard_batch(setup.batch, group.rank, group.world_size)


def memory_rows(setup: Setup, group: Group) -> list[Row]:
    """Memory of each rank, in runs of their own: bytes autograd saves for backward (forward and loss on
    the rank's share) and the peak of live tensor bytes in one warm training step
    (:func:`reportgen.memory.peak.warm_step_peak`, torch's MemTracker; on CUDA the allocator's peaks beside
    it). On rank 0 the maximum over ranks: recompute's worst-rank peak must not exceed plain's
    (``memory.peak_on_miss`` on a miss) and it must save less (advisory, WARN)."""
    local, paths = local_share(setup, group), [w.path for w in setup.wrapped]
    measured = {}
    for variant, recompute in (("plain", False), ("recompute", True)):
        with twin(variant):  # an exception names the twin that raised
            model = spread_twin(setup, group, recompute)
            measured[variant] = saved_activation_bytes(
                model, local, setup.task.loss, setup.config.forward_seed, paths
            ).total_bytes
    rows = [
        ranked(
            Row(
                check=DIST_MEMORY,
                item=f"saved activations ({variant})",
                variant=variant,
                metric="saved_activation_bytes",
                value=float(value),
                unit="B",
                role=ROLE_RANK_TOTAL,
                status=Status.INFO,
                detail=f"bytes autograd keeps for backward on rank {group.rank} ({variant} twin)",
            ),
            group.rank,
        )
        for variant, value in measured.items()
    ]
    peaks = {}
    for variant, recompute in (("plain", False), ("recompute", True)):
        with twin(variant):
            peaks[variant] = warm_step_peak(
                spread_twin(setup, group, recompute),
                local,
                setup.task.loss,
                setup.config.parity.optimizer,
                setup.config.forward_seed,
                warm_steps=1,
            )
    rows += [
        ranked(
            Row(
                check=DIST_MEMORY,
                item=f"step peak ({variant})",
                variant=variant,
                metric="peak_live_bytes",
                value=float(peak.peak_bytes),
                unit="B",
                role=ROLE_RANK_PEAK,
                status=Status.INFO,
                detail=f"live tensor bytes at the peak of a warm step on rank {group.rank} ({variant} twin), "
                f"reached in {peak.phase}" + (f" of {peak.module}" if peak.module else ""),
                extra={"phase": peak.phase, **(peak.cuda or {})},
            ),
            group.rank,
        )
        for variant, peak in peaks.items()
    ]
    worst = max_over_ranks(
        [
            float(measured["plain"]),
            float(measured["recompute"]),
            float(peaks["plain"].peak_bytes),
            float(peaks["recompute"].peak_bytes),
        ],
        group,
    )
    if group.rank != 0:
        return rows
    section: MemoryConfig = setup.config.memory
    on_miss = section.peak_on_miss
    return rows + [
        *max_pair_rows(
            "step peak",
            "peak_live_bytes",
            ROLE_MAX_PEAK,
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
            "saved_activation_bytes",
            ROLE_MAX_SAVED,
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
        role: the rows' role (:data:`ROLE_MAX_PEAK`, :data:`ROLE_MAX_SAVED`).
        plain, recompute: each twin's maximum over ranks, bytes.
        comparator: how recompute must compare with plain (``"<="``, ``"<"``).
        on_miss: the recompute row's status when missed (FAIL, or WARN when advisory).
        plain_detail, recompute_detail: each row's sentence.

    Returns:
        ``[plain row, recompute row]``.
    """
    return [
        Row(
            check=DIST_MEMORY,
            item=f"{item}, max over ranks (plain)",
            variant="plain",
            metric=metric,
            value=plain,
            unit="B",
            role=role,
            status=Status.INFO,
            detail=plain_detail,
        ),
        Row(
            check=DIST_MEMORY,
            item=f"{item}, max over ranks (recompute)",
            variant="recompute",
            metric=metric,
            value=recompute,
            threshold=f"{comparator} {plain:.0f} B (plain, max over ranks)",
            comparator=comparator,
            role=role,
            unit="B",
            threshold_value=plain,
            on_miss=on_miss,
            detail=recompute_detail,
        ),
    ]


def time_rows(setup: Setup, group: Group) -> list[Row]:
    """Warm training steps of the distributed plain and recompute twins, interleaved; each step's time is
    the maximum over ranks (the slowest rank sets the pace). Rows: each rank's median (per rank) and,
    on rank 0, the medians of the per-step maxima and the paired overhead ratio with its bootstrap CI
    (:func:`reportgen.results.bootstrap.bootstrap_ratio_ci`, ``timing.bootstrap_samples``), judged ``ci<=``
    against ``timing.max_overhead_ratio`` when that is set (INFO otherwise)."""
    tc: TimingConfig = setup.config.timing
    local = local_share(setup, group)
    steps: dict[str, Callable[[], None]] = {
        variant: make_train_step(
            spread_twin(setup, group, recompute),
            local,
            setup.task.loss,
            setup.config.parity.optimizer,
            setup.config.forward_seed,
        )
        for variant, recompute in (("plain", False), ("recompute", True))
    }
    sync = (lambda: torch.cuda.synchronize(group.device)) if group.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {"plain": [], "recompute": []}
    for index in range(tc.warmup_steps + tc.measured_steps):
        for variant, step in steps.items():
            sync()
            start = time.perf_counter()
            with twin(variant):
                step()
            sync()
            if index >= tc.warmup_steps:
                times[variant].append((time.perf_counter() - start) * 1e3)
    rows = [
        ranked(
            Row(
                check=DIST_TIME,
                item=f"median step ({variant})",
                variant=variant,
                metric="step_time_ms",
                value=statistics.median(ms),
                unit="ms",
                role=ROLE_RANK_STEP,
                status=Status.INFO,
                detail=f"median of {len(ms)} warm steps on rank {group.rank}",
            ),
            group.rank,
        )
        for variant, ms in times.items()
    ]
    worst = {variant: max_over_ranks(ms, group) for variant, ms in times.items()}
    if group.rank != 0:
        return rows
    plain, recompute = statistics.median(worst["plain"]), statistics.median(worst["recompute"])
    rows += [
        Row(
            check=DIST_TIME,
            item=f"median step, max over ranks ({variant})",
            variant=variant,
            metric="step_time_ms",
            value=value,
            unit="ms",
            role=ROLE_MAX_STEP,
            status=Status.INFO,
            detail=f"median over {len(worst[variant])} steps of the slowest rank's time",
        )
        for variant, value in (("plain", plain), ("recompute", recompute))
    ]
    ratio, low, high = bootstrap_ratio_ci(worst["plain"], worst["recompute"], tc.bootstrap_samples)
    bound = tc.max_overhead_ratio
    detail = (
        f"median over {len(worst['plain'])} interleaved rounds of recompute/plain, each step timed as the slowest of "
        f"{group.world_size} ranks; paired-bootstrap 95% CI {low:.3f}–{high:.3f}"
    )
    rows.append(
        Row(
            check=DIST_TIME,
            item="overhead ratio (slowest rank per step)",
            variant="recompute",
            metric="overhead_ratio",
            value=ratio,
            threshold=f"<= {bound}" if bound is not None else "",
            comparator="ci<=" if bound is not None else "",
            role=ROLE_MAX_OVERHEAD,
            unit="ratio",
            status=Status.INFO,
            threshold_value=float(bound) if bound is not None else float("nan"),
            detail=detail,
            extra={"ci_low": low, "ci_high": high, "rounds": len(worst["plain"])},
        )
    )
    return rows
