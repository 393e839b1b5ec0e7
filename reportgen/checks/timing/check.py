"""Warm-step time (checklist item 4, docs/architecture.md): what recomputation costs, with a confidence interval.

Following nanoGPT's ``bench.py``: a burn-in stage (``timing.warmup_steps`` steps of each
twin, excluded), then ``timing.measured_steps`` steps of each twin, interleaved (the order
of the pair alternates each round) so drift of clocks, caches and other load hits both.
On CUDA, ``torch.cuda.synchronize`` runs on both sides of every timed step. A step is a
full training step on the fixed batch: forward, loss, backward, optimizer step
(``budget.optimizer``), ``zero_grad``; timed with ``time.perf_counter``.

The overhead ratio is the median over rounds of (recompute step / plain step of the same
round), with a percentile-bootstrap 95% confidence interval over rounds (numpy, seeded): the
paired estimator cancels drift both steps of a round share. The ratio of the two medians is
reported beside it. Rounds continue past ``timing.measured_steps`` until the interval's
half-width is within ``timing.target_ci_half_width_pp`` or ``timing.max_measure_seconds`` is spent.
Beside it: the expected ratio from FLOPs
(:class:`torch.utils.flop_counter.FlopCounterMode`), recompute step FLOPs / plain step
FLOPs, i.e. one more forward of the wrapped regions. Memory-bound ops (dropout, LayerNorm,
softmax) are not in FLOP counts, so measured time may sit above it on a CPU.

A deadline (``timing.max_overhead_ratio``, ``timing.max_step_time_ms``) turns the cost into a
check: missed is FAIL and the row says by how much.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from reportgen.checks.base import Check, Section
from reportgen.checks.base.run import Run
from reportgen.checks.timing.plots import timing_plots
from reportgen.checks.timing.rows import VARIANTS, ci_width_row, flops_row, machine_load_row, median_rows, overhead_row
from reportgen.config import TIME, TimingConfig
from reportgen.memory.instrument import instrument
from reportgen.progress import progress
from reportgen.results import Role, Row, Status
from reportgen.results.bootstrap import bootstrap_ratio_ci
from reportgen.results.raised import raised_in
from reportgen.twins.twin import timed


def ci_half_width_pp(times: dict[str, list[float]], samples: int) -> float:
    """Half-width of the 95% bootstrap CI of the overhead ratio, percentage points."""
    _, low, high = bootstrap_ratio_ci(times["plain"], times["recompute"], samples)
    return (high - low) / 2 * 100


def ci_target_reached(target_pp: float, samples: int) -> Callable[[dict[str, list[float]]], bool]:
    """The stopping rule of adaptive timing: the 95% CI half-width is within ``target_pp`` pp.

    It computes the interval exactly as the reported ``overhead`` row does (same bootstrap
    samples and seed, :func:`bootstrap_ratio_ci`), so a run that stopped because the target
    was reached always reports an interval within it (``ci_width_row`` PASS).
    """
    return lambda times: ci_half_width_pp(times, samples) <= target_pp


def interleaved_times(
    steps: Mapping[str, Callable[[], None]],
    warmup: int,
    measured: int,
    device: torch.device,
    enough: Callable[[dict[str, list[float]]], bool] | None = None,
    max_seconds: float = math.inf,
) -> tuple[dict[str, list[float]], str]:
    """Run ``warmup`` untimed rounds, then at least ``measured`` timed rounds of every step.

    The order inside a round alternates (plain first, then recompute first, ...) so that
    neither variant always runs right after the other. With ``enough``, rounds continue past
    ``measured`` until ``enough(times)`` is true (checked every 4 rounds, every
    ``rounds // 8`` past 32: the check's cost grows with the rounds) or the measured rounds
    have taken ``max_seconds``.

    Returns:
        ``({variant: [ms per round]}, why it stopped)``.
    """
    names = list(steps)
    for i in range(warmup):
        for name in names if i % 2 == 0 else names[::-1]:
            with raised_in(name):
                steps[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    start, rounds, next_check = time.perf_counter(), 0, measured
    more = "" if enough is None else f", then until the CI target or {max_seconds:g} s of rounds"
    bar = progress(f"timing rounds (at least {measured}{more})", total=None if enough else measured, unit="round")
    while True:
        for name in names if rounds % 2 == 0 else names[::-1]:
            with raised_in(name):
                times[name].append(timed(steps[name], device))
        rounds += 1
        bar.update(1)
        if rounds < measured:
            continue
        if enough is None:
            why = f"{measured} rounds configured"
        elif rounds >= next_check and enough(times):
            why = "confidence target reached"
        elif time.perf_counter() - start > max_seconds:
            why = f"time budget of {max_seconds:g} s spent"
        else:
            if rounds >= next_check:  # every 4 rounds, then every 1/8 of the rounds so far (the bootstrap grows)
                next_check = rounds + max(4, rounds // 8)
            continue
        bar.close()
        return times, why


def step_flops(step: Callable[[], None]) -> int:
    """FLOPs of one call of ``step`` counted by ``torch.utils.flop_counter.FlopCounterMode``
    (matmuls, convolutions, attention; including those recomputed in backward)."""
    with instrument("the FLOP counter (FlopCounterMode)"), FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def warm_step_time(run: Run) -> list[Row]:
    """Time warm training steps of both twins, interleaved; judge the configured deadline.

    Returns:
        Rows of check ``warm-step time``: one ``step_time_ms`` row per measured step and
        variant (item ``step k``), the median per variant (with spread), ``overhead_ratio``
        with its 95% CI, and ``expected_overhead_ratio`` from FLOPs. Without a deadline the
        overhead row is INFO, or WARN when its CI stays wider than
        ``timing.target_ci_half_width_pp`` (too noisy to trust).
    """
    setup = run.setup
    tc: TimingConfig = setup.config.timing
    start = time.perf_counter()
    steps = {v: setup.train_step(v == "recompute") for v in VARIANTS}
    flops, flops_error = counted_flops(steps)  # also the first warm-up step of each
    enough = None
    if tc.target_ci_half_width_pp is not None:
        enough = ci_target_reached(tc.target_ci_half_width_pp, tc.bootstrap_samples)
    times, stopped = interleaved_times(
        steps, tc.warmup_steps, tc.measured_steps, setup.device, enough, tc.max_measure_seconds
    )
    seconds = time.perf_counter() - start
    rows = [
        Row.fact(
            TIME,
            f"step {k}",
            Role.STEP,
            "one measured step",
            metric="step_time_ms",
            value=ms,
            unit="ms",
            variant=v,
            extra={"step_index": k},
        )
        for v in VARIANTS
        for k, ms in enumerate(times[v])
    ]
    rows += median_rows(times, tc.max_step_time_ms, seconds)
    overhead = overhead_row(times, tc.bootstrap_samples, tc.max_overhead_ratio)
    overhead.extra.update(
        {"rounds": len(times["plain"]), "stopped": stopped, "target_ci_half_width_pp": tc.target_ci_half_width_pp}
    )
    rows.append(overhead)
    if tc.target_ci_half_width_pp is not None:
        rows.append(ci_width_row(overhead, tc.target_ci_half_width_pp, stopped))
    rows.append(flops_row(flops) if flops_error is None else flops_error)
    load = machine_load_row()
    return rows + ([load] if load else [])


def counted_flops(steps: Mapping[str, Callable[[], None]]) -> tuple[dict[str, int], Row | None]:
    """Run one step of each twin under ``FlopCounterMode``: ``({variant: FLOPs}, None)``.

    The FLOP count is a side estimate: where it cannot be computed (e.g. ``autograd.grad``
    inside a reentrant region), the step runs again uncounted and the count is a WARN row
    that says why, never an ERROR of the time check (its measured rows still decide).
    """
    try:
        return {v: step_flops(s) for v, s in steps.items()}, None
    except Exception as exc:  # noqa: BLE001 - a side estimate never decides the check
        for variant, step in steps.items():
            with raised_in(variant):
                step()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        detail = (
            f"not estimated: FlopCounterMode could not count a step ({type(exc).__name__}: {first}); "
            "the measured step times above stand on their own"
        )
        metric = "expected_overhead_ratio"
        return {}, Row.fact(
            TIME, "expected from FLOPs", Role.FLOPS, detail, status=Status.WARN, metric=metric, unit="ratio"
        )


CHECK = Check(
    warm_step_time,
    (
        Section(
            TIME,
            "What recomputation costs: warm training steps of both twins, interleaved; median, spread and a 95% "
            "confidence interval of the overhead, beside the FLOP bound of one extra forward.",
            template="sections/warm-step-time.html.j2",
            plotter=timing_plots,
            roles=(Role.STEP, Role.MEDIAN, Role.OVERHEAD, Role.OVERHEAD_CI, Role.FLOPS, Role.LOAD),
        ),
    ),
    config="timing",
)
