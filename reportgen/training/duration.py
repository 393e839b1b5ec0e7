"""How long the configured run will take, estimated before any check: :func:`estimate_run` times a few training
steps of each twin at the trajectory's and the budget's batch and multiplies by the steps the settings imply (beside
what every run does, :func:`fixed_phases`); past ``run.max_estimated_minutes`` :func:`refuse_long_runs` raises
:class:`RunTooLong` (exit 2, one line with the estimate and the override that allows it)."""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from reportgen.config import BudgetConfig, LargerBatchConfig, ParityConfig, TimingConfig
from reportgen.errors import SetupError
from reportgen.memory.peak import warm_step_peak
from reportgen.results.distance import measure, tolerances
from reportgen.training.loop import evaluate
from reportgen.twins.setup import NOT_DRAWN, Setup
from reportgen.twins.twin import timed

log = logging.getLogger("reportgen")

#: Steps timed per twin and batch size; the fastest after the first (warm-up) counts.
TIMED_STEPS = 3


class RunTooLong(SetupError):
    """The settings imply a run longer than ``run.max_estimated_minutes`` (exit 2, the message gives the override)."""


@dataclass
class Estimate:
    """Estimated wall time of the long phases of a run.

    Attributes:
        phases: ``{phase: seconds}``, e.g. ``{"trajectory parity": 12.0, "task metrics": 300.0}``, s: the
            expected length (a phase that stops on a criterion: its least).
        upper: ``{phase: seconds}`` of the phases that stop on a criterion, at their cap (the adaptive
            timing: ``timing.max_measure_seconds``).
        drivers: ``{phase: the settings that set its length}``, e.g. ``"parity.steps=8 × 3 twins × 4.1 ms"``.
    """

    phases: dict[str, float] = field(default_factory=dict)
    drivers: dict[str, str] = field(default_factory=dict)
    upper: dict[str, float] = field(default_factory=dict)

    @property
    def minutes(self) -> float:
        """The whole estimate, minutes (each phase at its expected length)."""
        return sum(self.phases.values()) / 60

    @property
    def upper_minutes(self) -> float:
        """The longest the run can take, minutes: phases that stop on a criterion (the adaptive timing) at
        their cap, the rest as estimated. What :func:`refuse_long_runs` holds against the limit."""
        return sum(self.upper.get(name, seconds) for name, seconds in self.phases.items()) / 60

    def describe(self, share: float = 0.0) -> str:
        """``"about 3.2 h: task metrics 3.1 h (budget.examples=...), trajectory parity 5 min (...)"``, longest first.

        Args:
            share: leave out phases below this share of the whole (0.1 = the phases that make it long).
        """
        total = sum(self.phases.values())
        parts = [
            f"{name} {format_duration(seconds)}"
            + (f" to {format_duration(self.upper[name])}" if self.upper.get(name, seconds) > seconds else "")
            + f" ({self.drivers[name]})"
            for name, seconds in sorted(self.phases.items(), key=lambda kv: -kv[1])
            if seconds >= share * total
        ]
        return f"about {format_duration(total)}: " + ", ".join(parts)


def format_duration(seconds: float) -> str:
    """Seconds for people: ``"45 s"``, ``"12 min"``, ``"3.2 h"``, ``"41 days"``, ``"1.9e+05 years"``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds < 730 * 86400:
        return f"{seconds / 86400:.0f} days"
    return f"{seconds / (365 * 86400):.2g} years"


def _rng_kept(setup: Setup):
    """``torch.random.fork_rng`` over the CPU and the run's CUDA device: every generator restored on exit."""
    return torch.random.fork_rng(devices=[setup.device.index or 0] if setup.device.type == "cuda" else [])


def step_seconds(setup: Setup, recompute: bool, batch_size: int, steps: int = TIMED_STEPS) -> float:
    """Wall time of one training step of a fresh twin on a batch of ``batch_size``, s (uncompiled).

    ``steps`` steps run; the fastest after the first (allocations, lazy init) counts. Every
    random generator is restored afterwards, so the run's checks see the state they would have
    seen without the estimate.
    """
    with _rng_kept(setup):
        batch = (
            setup.batch
            if batch_size == setup.config.parity.batch_size and setup.batch is not NOT_DRAWN
            else setup.make_batch(batch_size, setup.config.seed)
        )
        step = setup.train_step(recompute, compiled=False, batch=batch)
        times = [timed(step, setup.device) / 1e3 for _ in range(max(2, steps))]
    return min(times[1:])


def evaluation_seconds(setup: Setup) -> float:
    """Wall time of one held-out evaluation (``task.evaluate`` on a fresh plain twin), s; RNG restored."""
    with _rng_kept(setup):
        model = setup.build(False, compiled=False)
        start = time.perf_counter()
        evaluate(model, setup.task)
        return time.perf_counter() - start


def estimate_run(setup: Setup) -> Estimate:
    """Estimate the trajectory, timing, task-metrics and larger-batch phases of ``setup.config``.

    Phases that are disabled (``budget.enabled=false``, ...) are left out. Training runs count
    their steps and their held-out evaluations (``budget.eval_every``). The larger-batch
    experiment is counted as one more recompute training run per seed (the same examples at a
    larger batch cost about the same), its batch-size search is not counted.

    Returns:
        The :class:`Estimate`.
    """
    parity: ParityConfig = setup.config.parity
    tc: TimingConfig = setup.config.timing
    bc: BudgetConfig = setup.config.budget
    lb: LargerBatchConfig = setup.config.larger_batch
    est = Estimate()
    measured: dict[tuple[bool, int], float] = {}

    def step(recompute: bool, batch: int) -> float:
        if (recompute, batch) not in measured:
            measured[(recompute, batch)] = step_seconds(setup, recompute, batch)
        return measured[(recompute, batch)]

    pb = parity.batch_size
    plain, rec = step(False, pb), step(True, pb)
    steps = parity.steps
    est.phases["trajectory parity"] = steps * (3 * plain + rec)
    est.drivers["trajectory parity"] = (
        f"parity.steps={steps} × 4 twin runs (plain beside its A/A twin, then beside the recompute twin) × "
        f"{(3 * plain + rec) / 4 * 1e3:.3g} ms"
    )
    fixed_phases(setup, est, plain, rec)
    if tc.enabled:
        rounds = tc.warmup_steps + tc.measured_steps
        est.phases["warm-step time"] = rounds * (plain + rec)  # at least timing.measured_steps rounds
        est.drivers["warm-step time"] = f"timing.measured_steps={tc.measured_steps}"
        if tc.target_ci_half_width_pp is not None:  # more rounds until the CI is tight enough, up to the cap
            cap = tc.warmup_steps * (plain + rec) + tc.max_measure_seconds
            est.upper["warm-step time"] = max(est.phases["warm-step time"], cap)
            est.drivers["warm-step time"] += (
                f", then up to timing.max_measure_seconds={tc.max_measure_seconds:g} until the 95% CI is "
                f"within {tc.target_ci_half_width_pp:g} pp"
            )
    if bc.enabled:
        bb, examples, seeds = bc.batch_size, bc.examples, len(bc.seeds)
        steps_per_run = math.ceil(examples / bb)
        evals = (math.ceil(examples / bc.eval_every) if bc.eval_every > 0 else 1) + 1
        eval_s = evaluation_seconds(setup)
        per_seed = steps_per_run * (step(False, bb) + step(True, bb)) + 2 * evals * eval_s
        est.phases["task metrics"] = seeds * per_seed
        est.drivers["task metrics"] = (
            f"budget.examples={examples} / budget.batch_size={bb} × {seeds} seeds × "
            f"2 twins × {(step(False, bb) + step(True, bb)) / 2 * 1e3:.3g} ms, "
            f"and {evals} evaluations per run × {eval_s * 1e3:.3g} ms"
        )
        if lb.enabled:
            lb_seeds = len(lb.seeds) if lb.seeds is not None else seeds
            est.phases["larger-batch experiment"] = lb_seeds * (steps_per_run * step(True, bb) + evals * eval_s)
            est.drivers["larger-batch experiment"] = f"budget.examples={examples} × {lb_seeds} seeds"
    return est


#: Seconds of the report itself (metadata, rendering with its plots, PDF, CI files, signing) on a 2-core
#: AMD EPYC, measured with benchmarks/harness_overhead.py (phases ``run_metadata`` .. ``finish_ci_outputs``):
#: ffn 3.6 s signed, mlp 3.8 s and the 113M Llama config 3.7 s unsigned (signing adds about 0.3 s).
REPORT_SECONDS = 4.0
#: The same without the PDF (``report.pdf=false``): WeasyPrint's layout is about 2 of those seconds.
REPORT_SECONDS_NO_PDF = 2.0


def fixed_phases(setup: Setup, est: Estimate, plain: float, rec: float) -> None:
    """Add what every run does beside its long phases: the checks on the fixed batch (gradient, step and
    memory), the twin copies (:mod:`reportgen.twins.template`), the tensor comparisons, the report, and
    what this process has spent before the estimate (imports, the one build, the estimate itself).

    Args:
        plain, rec: seconds of one training step of each twin at ``parity.batch_size``.
    """
    mc = setup.config.memory
    warm = max(1, mc.warm_steps) + 1  # warm steps and the measured one, per twin
    cuda = setup.device.type == "cuda"
    tracked = tracked_step_seconds(setup) if mc.enabled else 0.0
    short = (
        3 * (plain + rec)
        + (2 * (plain + rec) + warm * 2 * tracked + (warm * (plain + rec) if cuda else 0.0)) * mc.enabled
    )
    est.phases["gradient, step and memory checks"] = short
    est.drivers["gradient, step and memory checks"] = f"9 fixed-batch runs × {(plain + rec) / 2 * 1e3:.3g} ms" + (
        f", {2 * warm} steps under the memory tracker × {tracked * 1e3:.3g} ms" if mc.enabled else ""
    )
    copies = twin_copies(setup)
    copy = copy_seconds(setup)
    est.phases["twin copies"] = copies * copy
    est.drivers["twin copies"] = f"{copies} twins copied from the one build × {copy * 1e3:.3g} ms"
    passes = 2 + 2 * 3 + setup.config.parity.steps * 2 * 3  # gradients; parameters and two optimizer moments
    compare = comparison_seconds(setup)
    est.phases["comparisons"] = passes * compare
    est.drivers["comparisons"] = f"{passes} parameter-sized comparisons × {compare * 1e3:.3g} ms (equal tensors)"
    est.phases["report"] = REPORT_SECONDS if setup.config.report.pdf else REPORT_SECONDS_NO_PDF
    est.drivers["report"] = "rendering, PDF and signing (measured fixed cost, REPORT_SECONDS)"
    est.phases["so far"] = process_seconds()
    est.drivers["so far"] = "imports, the one build and this estimate"


def twin_copies(setup: Setup) -> int:
    """How many twins the run copies from the one build: gradient and step parity 3 each, the trajectory 4,
    the memory check 6 (8 on CUDA), timing 2, 2 per budget seed, the larger-batch search (a probe per
    doubling and per bisection step) and its seeds, and the 5 of this estimate."""
    cfg = setup.config
    count = 3 + 3 + 4 + 5 + (6 + 2 * (setup.device.type == "cuda")) * cfg.memory.enabled + 2 * cfg.timing.enabled
    if cfg.budget.enabled:
        seeds = len(cfg.budget.seeds)
        count += 2 * seeds
        if cfg.larger_batch.enabled:
            doublings = max(1, math.ceil(math.log2(max(2, cfg.larger_batch.max_batch_size / cfg.budget.batch_size))))
            lb_seeds = len(cfg.larger_batch.seeds) if cfg.larger_batch.seeds is not None else seeds
            count += 2 * doublings + lb_seeds
    return count


def copy_seconds(setup: Setup) -> float:
    """Wall time of one twin copied from the one build, s (:meth:`reportgen.twins.setup.Setup.build`)."""
    with _rng_kept(setup):
        start = time.perf_counter()
        setup.build(False, compiled=False)
        return time.perf_counter() - start


def comparison_seconds(setup: Setup) -> float:
    """Wall time of comparing every parameter of the one build with itself, s
    (:func:`reportgen.results.distance.measure` on equal tensors, the common case of a healthy model; a
    tensor that differs takes the chunked float64 path, several times longer)."""
    start = time.perf_counter()
    for p in setup.template.module.parameters():
        measure(p, p, *tolerances(p.dtype))
    return time.perf_counter() - start


def tracked_step_seconds(setup: Setup) -> float:
    """Wall time of one training step of the plain twin under the memory check's tracker, s
    (:func:`reportgen.memory.peak.warm_step_peak`)."""
    with _rng_kept(setup), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = setup.train_step(False, compiled=False)
        start = time.perf_counter()  # the optimizer state from a step on zero gradients, then one tracked step
        warm_step_peak(step, 0)
        return time.perf_counter() - start


def process_seconds() -> float:
    """Seconds since this process started (Linux ``/proc``; 0 where it cannot be read)."""
    try:
        started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def refuse_long_runs(setup: Setup) -> Estimate | None:
    """Estimate the run (:func:`estimate_run`) and refuse it past ``run.max_estimated_minutes``.

    Returns:
        The estimate (also logged), or None when ``run.max_estimated_minutes`` is null (no estimate
        is made) or a timed step or evaluation raised (the user's code: the checks that run it
        turn the exception into ERROR rows, so the estimate never stops a run itself).

    Raises:
        RunTooLong: the estimate exceeds the limit; the message gives it, the settings behind it
            and the override that allows the run.
    """
    limit = setup.config.run.max_estimated_minutes
    if limit is None:
        return None
    try:
        est = estimate_run(setup)
    except Exception:  # noqa: BLE001 - the user's model or task raised: the checks record it as ERROR rows
        log.info(
            "no run-time estimate: a timed step or evaluation of the twins raised; the checks that run "
            "them show the error, once each"
        )
        return None
    log.info("estimated run time: %s", est.describe())
    if est.upper_minutes > limit:
        allow = max(int(limit) + 1, math.ceil(est.upper_minutes * 1.5))
        raise RunTooLong(
            f"the settings imply a run of {est.describe(share=0.1)}; that is past run.max_estimated_minutes="
            f"{limit:g}. Lower the settings named, or allow it with "
            f"run.max_estimated_minutes={allow} (or run.max_estimated_minutes=null for no limit)"
        )
    return est
