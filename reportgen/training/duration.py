"""How long the configured run will take, estimated before any check (time one step, multiply).

Settings such as ``parity.steps=100000`` or ``budget.examples=10**12`` are valid values that
imply hours or years. Before the checks, :func:`estimate_run` times a few training steps of a
fresh plain and recompute twin at the trajectory's batch (``parity.batch_size``) and at the
budget's batch (``budget.batch_size``) and multiplies by the steps the settings imply; past
``run.max_estimated_minutes`` (reportgen/config.py, default 60) :func:`refuse_long_runs`
raises :class:`RunTooLong`, which the pipeline turns into exit 2 with one line giving the
estimate and the override that allows it.

The estimate counts training steps only (no evaluation, snapshots, plots or PDF), so it is a
lower bound of the phases it names; it is good enough to tell minutes from hours.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import torch

from reportgen.config import BudgetConfig, LargerBatchConfig, ParityConfig, TimingConfig
from reportgen.errors import SetupError
from reportgen.memory.saved import make_train_step, training_optimizer
from reportgen.training.loop import evaluate
from reportgen.twins.setup import Setup

log = logging.getLogger("reportgen")

#: Steps timed per twin and batch size; the fastest after the first (warm-up) counts.
TIMED_STEPS = 3


class RunTooLong(SetupError):
    """The settings imply a run longer than ``run.max_estimated_minutes`` (exit 2, the message gives the override)."""


@dataclass
class Estimate:
    """Estimated wall time of the long phases of a run.

    Attributes:
        phases: ``{phase: seconds}``, e.g. ``{"trajectory parity": 12.0, "task metrics": 300.0}``, s.
        drivers: ``{phase: the settings that set its length}``, e.g. ``"parity.steps=8 × 3 twins × 4.1 ms"``.
        step_ms: ``{"plain@64": ms, "recompute@64": ms, ...}``: the timed step per twin and batch size, ms.
    """

    phases: dict[str, float] = field(default_factory=dict)
    drivers: dict[str, str] = field(default_factory=dict)
    step_ms: dict[str, float] = field(default_factory=dict)

    @property
    def minutes(self) -> float:
        """The whole estimate, minutes."""
        return sum(self.phases.values()) / 60

    def describe(self, share: float = 0.0) -> str:
        """``"about 3.2 h: task metrics 3.1 h (budget.examples=...), trajectory parity 5 min (...)"``, longest first.

        Args:
            share: leave out phases below this share of the whole (0.1 = the phases that make it long).
        """
        total = sum(self.phases.values())
        parts = [
            f"{name} {format_duration(seconds)} ({self.drivers[name]})"
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


def step_seconds(setup: Setup, recompute: bool, batch_size: int, steps: int = TIMED_STEPS) -> float:
    """Wall time of one training step of a fresh twin on a batch of ``batch_size``, s (uncompiled).

    ``steps`` steps run; the fastest after the first (allocations, lazy init) counts. Every
    random generator is restored afterwards, so the run's checks see the state they would have
    seen without the estimate.
    """
    devices = [setup.device.index or 0] if setup.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        batch = (
            setup.batch
            if batch_size == setup.config.parity.batch_size and setup.batch is not None
            else setup.make_batch(batch_size, setup.config.seed)
        )
        step = make_train_step(
            setup.build(recompute, compiled=False),
            batch,
            setup.task.loss,
            training_optimizer(setup),
            setup.config.forward_seed,
        )
        times = []
        for _ in range(max(2, steps)):
            if setup.device.type == "cuda":
                torch.cuda.synchronize(setup.device)
            start = time.perf_counter()
            step()
            if setup.device.type == "cuda":
                torch.cuda.synchronize(setup.device)
            times.append(time.perf_counter() - start)
    return min(times[1:])


def evaluation_seconds(setup: Setup) -> float:
    """Wall time of one held-out evaluation (``task.evaluate`` on a fresh plain twin), s; RNG restored."""
    devices = [setup.device.index or 0] if setup.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        model = setup.build(False, compiled=False)
        start = time.perf_counter()
        evaluate(model, setup.task)
        return time.perf_counter() - start


def estimate_run(setup: Setup) -> Estimate:
    """Estimate the trajectory, timing, task-metrics and larger-batch phases of ``setup.cfg``.

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
            est.step_ms[f"{'recompute' if recompute else 'plain'}@{batch}"] = measured[(recompute, batch)] * 1e3
        return measured[(recompute, batch)]

    pb = parity.batch_size
    plain, rec = step(False, pb), step(True, pb)
    steps = parity.steps
    est.phases["trajectory parity"] = steps * (2 * plain + rec)
    est.drivers["trajectory parity"] = f"parity.steps={steps} × 3 twins × {(2 * plain + rec) / 3 * 1e3:.3g} ms"
    if tc.enabled:
        rounds = tc.warmup_steps + tc.measured_steps
        seconds = rounds * (plain + rec)
        if tc.target_ci_half_width_pp is not None:
            seconds = max(seconds, tc.warmup_steps * (plain + rec) + tc.max_measure_seconds)
        est.phases["warm-step time"] = seconds
        est.drivers["warm-step time"] = (
            f"timing.max_measure_seconds={tc.max_measure_seconds:g}"
            if tc.target_ci_half_width_pp is not None
            else f"timing.measured_steps={tc.measured_steps}"
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
    log.info("estimated time of the long phases: %s", est.describe())
    if est.minutes > limit:
        allow = max(int(limit) + 1, math.ceil(est.minutes * 1.5))
        raise RunTooLong(
            f"the settings imply a run of {est.describe(share=0.1)}; that is past run.max_estimated_minutes="
            f"{limit:g}. Lower the settings named, or allow it with "
            f"run.max_estimated_minutes={allow} (or run.max_estimated_minutes=null for no limit)"
        )
    return est
