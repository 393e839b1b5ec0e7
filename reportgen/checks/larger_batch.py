"""The flagged larger-batch experiment (checklist item 6, docs/architecture.md).

Recomputation frees activation memory; this experiment finds the batch that the saving buys
and trains the recompute twin at it to the same accepted-example budget. A larger batch
changes the optimisation (fewer, larger steps), so this is a second experiment, never a
parity test: every row is FLAGGED and never counts toward the verdict, whatever it shows.

Fit criterion: "the recompute twin at batch B needs no more memory than the plain twin at the
base batch (``budget.batch_size``)", measured as

* on CUDA: peak allocated bytes of a warm training step (forward, backward, optimizer step),
  ``torch.cuda.reset_peak_memory_stats`` right before it, synchronized, read with
  ``torch.cuda.max_memory_allocated``; an out-of-memory is a measured boundary (does not fit);
* elsewhere: bytes of the activations autograd saves for backward
  (:func:`reportgen.memory.saved.saved_activation_bytes`, exact on any device).

Search: doubling from the base batch until a batch does not fit (or the ceiling
``larger_batch.max_batch_size``, or the most examples the task can put in one batch), then
bisection between the last fitting and the first failing batch, to one example.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from reportgen.checks.base import TRAINED_ROLES, Check, Section
from reportgen.checks.base.plots import larger_batch_plots
from reportgen.checks.base.run import Run
from reportgen.config import LARGER_BATCH, BudgetConfig, LargerBatchConfig
from reportgen.memory.saved import cuda_step_peaks, saved_activation_bytes
from reportgen.results import Role, Row, Status
from reportgen.structure import batch_size_of
from reportgen.training.loop import LR_SCALING
from reportgen.training.rows import run_rows

log = logging.getLogger("reportgen")


@dataclass
class Probe:
    """One measured batch size in the search.

    Attributes:
        batch_size: examples asked for.
        bytes: the criterion's bytes at this batch (NaN when it could not be measured), B.
        fits: True when ``bytes`` is within the reference.
        note: why it does not fit: ``""``, ``"over the reference"``, ``"out of memory"``,
            ``"task gives at most N examples per batch"``.
    """

    batch_size: int
    bytes: float
    fits: bool
    note: str = ""


def largest_fitting_batch(probe: Callable[[int], Probe], base: int, ceiling: int) -> tuple[int | None, list[Probe]]:
    """Doubling from ``base``, then bisection: the largest batch ``probe`` says fits.

    Assumes memory grows with the batch (a batch that does not fit bounds every larger one).

    Args:
        probe: ``fn(batch_size) -> Probe``; must not raise for an out-of-memory (return
            ``fits=False``).
        base: the first batch tried, examples (the plain run's batch).
        ceiling: the largest batch tried, examples.

    Returns:
        ``(largest fitting batch or None when even base does not fit, probes in order)``.
    """
    probes: list[Probe] = []

    def fits(batch_size: int) -> bool:
        probes.append(probe(batch_size))
        return probes[-1].fits

    if not fits(base):
        return None, probes
    lo, hi = base, None
    while hi is None:
        nxt = min(2 * lo, ceiling)
        if nxt <= lo:
            return lo, probes  # the ceiling fits
        if fits(nxt):
            lo = nxt
        else:
            hi = nxt
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def saved_bytes(setup, recompute: bool, batch_size: int) -> tuple[int, int]:
    """Saved-activation bytes of a fresh twin on a batch (any device).

    Returns:
        ``(total bytes, examples actually in the batch)``.
    """
    batch = setup.make_batch(batch_size, setup.config.seed)
    model = setup.build(recompute)
    paths = [w.path for w in setup.wrapped]
    saved = saved_activation_bytes(model, batch, setup.training_step, setup.config.forward_seed, paths)
    return int(saved.total_bytes), batch_size_of(batch[0])


def cuda_peak_bytes(setup, recompute: bool, batch_size: int) -> tuple[int, int]:
    """Peak allocated CUDA bytes of a warm training step of a fresh twin on a probe batch
    (one warm step first; see :func:`reportgen.memory.saved.cuda_step_peaks`).

    Returns:
        ``(peak allocated bytes, examples actually in the batch)``.

    Raises:
        torch.cuda.OutOfMemoryError: the step does not fit on the device.
    """
    batch = setup.make_batch(batch_size, setup.config.seed)
    peaks = cuda_step_peaks(setup, recompute, warm_steps=1, batch=batch)
    return int(peaks["peak_allocated_bytes"]), batch_size_of(batch[0])


def make_probe(measure: Callable[[int], tuple[int, int]], reference: int) -> Callable[[int], Probe]:
    """A search probe from ``measure(batch) -> (bytes, examples drawn)`` and the reference bytes.

    An out-of-memory is a measured boundary (``fits=False``); a task that returns fewer
    examples than asked is the ceiling (``fits=False``).
    """

    def probe(batch_size: int) -> Probe:
        try:
            nbytes, drawn = measure(batch_size)
        except torch.cuda.OutOfMemoryError:
            log.info("larger batch: batch %d is out of memory (a measured boundary)", batch_size)
            return Probe(batch_size, math.nan, False, "out of memory")
        if drawn < batch_size:
            return Probe(batch_size, float(nbytes), False, f"task gives at most {drawn} examples per batch")
        fits = nbytes <= reference
        log.info("larger batch: batch %d needs %d B (%s)", batch_size, nbytes, "fits" if fits else "over the reference")
        return Probe(batch_size, float(nbytes), fits, "" if fits else "over the reference")

    return probe


def larger_batch_experiment(run: Run) -> list[Row]:
    """Find the largest batch whose recompute memory fits the plain run's; train at it.

    The learning rate is unchanged unless ``larger_batch.lr_scaling`` names a rule
    (:data:`reportgen.training.loop.LR_SCALING`); the rule and the lr used are in the rows.

    Returns:
        FLAGGED rows only (variant ``larger_batch``): the reference bytes, each search probe
        (``batch_size``, ``fits`` columns), the batch found (metric ``batch_size``) and, per seed,
        the larger-batch run (task metric, steps, accepted examples, skipped steps, curve) next
        to the plain run at the base batch for comparison (``batch_size`` column tells them
        apart). An error becomes a FLAGGED row whose detail says what went wrong.
    """
    start = time.perf_counter()
    try:
        return _experiment(run)
    except Exception as exc:  # the experiment never changes the verdict, even when it breaks
        log.exception("larger-batch experiment raised")
        detail, seconds = f"the experiment could not finish: {type(exc).__name__}: {exc}", time.perf_counter() - start
        return [_flagged("experiment", Role.EXCEPTION, detail, metric="exception", seconds=seconds)]


def _flagged(item: str, role: str, detail: str, **columns: Any) -> Row:
    """A fact of the experiment (:meth:`Row.fact`, variant ``larger_batch``), FLAGGED: it never counts."""
    return Row.fact(LARGER_BATCH, item, role, detail, status=Status.FLAGGED, variant="larger_batch", **columns)


def _experiment(run: Run) -> list[Row]:
    setup = run.setup
    section: LargerBatchConfig = setup.config.larger_batch
    budget: BudgetConfig = setup.config.budget
    task = setup.task
    if section.lr_scaling not in LR_SCALING:
        raise ValueError(f"larger_batch.lr_scaling={section.lr_scaling!r} is not one of {', '.join(LR_SCALING)}")
    base, ceiling = budget.batch_size, section.max_batch_size
    cuda = setup.device.type == "cuda"
    criterion = "cuda_peak_allocated_bytes" if cuda else "saved_activation_bytes"
    measure = (lambda b, rc: cuda_peak_bytes(setup, rc, b)) if cuda else (lambda b, rc: saved_bytes(setup, rc, b))
    what = "peak allocated CUDA bytes of a warm training step" if cuda else "bytes of activations saved for backward"

    t0 = time.perf_counter()
    log.info("larger batch: measuring the plain twin at batch %d (%s)", base, criterion)
    reference, _ = measure(base, False)
    said, seconds = f"reference: {what} of the plain twin at the base batch", time.perf_counter() - t0
    columns = {"metric": criterion, "unit": "B"}
    item = f"plain at batch {base}"
    rows = [
        _flagged(item, Role.REFERENCE, said, value=reference, seconds=seconds, extra={"batch_size": base}, **columns)
    ]
    t0 = time.perf_counter()
    found, probes = largest_fitting_batch(make_probe(lambda b: measure(b, True), reference), base, ceiling)
    for p in probes:
        said = "fits" if p.fits else f"does not fit: {p.note}"
        extra = {"batch_size": p.batch_size, "fits": p.fits, "reference_bytes": reference}
        rows.append(
            _flagged(f"recompute at batch {p.batch_size}", Role.PROBE, said, value=p.bytes, extra=extra, **columns)
        )
        rows[-1].threshold = str(reference)  # for people: the plain twin's bytes it is held against (not judged)
    columns = {"metric": "batch_size", "unit": "examples"}
    if found is None:
        said = f"recompute at the base batch {base} already needs more than plain ({probes[0].note}); no larger batch to try"
        return [*rows, _flagged("batch found", Role.BATCH_FOUND, said, seconds=time.perf_counter() - t0, **columns)]
    boundary = next((p for p in reversed(probes) if not p.fits and p.batch_size == found + 1), None)
    why = (
        f"batch {found + 1} does not fit ({boundary.note})"
        if boundary
        else f"the search ceiling larger_batch.max_batch_size={ceiling}"
        if found >= ceiling
        else ""
    )
    ratio = found / base
    scale = LR_SCALING[section.lr_scaling](ratio)
    said = (
        f"the largest batch at which the recompute twin's {what} are no more than the plain twin's at "
        f"batch {base} ({found / base:.2f}x the base batch); found by doubling then bisection in "
        f"{len(probes)} probes; {why}; learning rate "
        f"{'unchanged' if section.lr_scaling == 'none' else f'scaled {scale:.3g}x'} "
        f"(larger_batch.lr_scaling={section.lr_scaling})"
    )
    extra, seconds = {"batch_size": found, "lr_scale": scale}, time.perf_counter() - t0
    rows.append(_flagged("batch found", Role.BATCH_FOUND, said, value=found, seconds=seconds, extra=extra, **columns))
    seeds = [int(s) for s in (section.seeds if section.seeds is not None else budget.seeds)]
    larger: list[float] = []  # the held-out metric of each seed's run
    plain: list[float] = []
    for seed in seeds:
        for recompute, batch_size, lr_scale in ((True, found, scale), (False, base, 1.0)):
            result = run.budget_runs.get(setup, recompute, seed, batch_size, lr_scale)
            if not result.complete:
                said = (
                    f"budget not reached: {result.skipped_steps} steps skipped for a non-finite loss or gradient "
                    "before the step cap"
                )
                rows.append(
                    Row.measured(
                        LARGER_BATCH,
                        f"seed {seed} batch {batch_size}",
                        "accepted_examples",
                        result.accepted_examples,
                        "examples",
                        comparator=">=",
                        threshold_value=math.nan,  # no number to meet: judge() gives on_miss, FAIL
                        threshold=str(budget.examples),
                        role=Role.ACCEPTED,
                        detail=said,
                        variant="larger_batch",
                        seconds=result.seconds,
                        extra={"seed": seed, "batch_size": batch_size},
                    )
                )
                continue
            role = "recompute at the larger batch" if recompute else "plain at the base batch, for comparison"
            ran = run_rows(
                LARGER_BATCH,
                "larger_batch",
                f"seed {seed} batch {batch_size}",
                seed,
                result,
                task.metric,
                Status.FLAGGED,
            )
            ran[0].detail = f"{role}: {ran[0].detail}"
            ran[0].extra["run_label"] = role
            rows += ran
            (larger if recompute else plain).append(result.metrics[task.metric])
    for name, values, batch_size in (("larger", larger, found), ("base", plain, base)):
        if values:
            mean, std = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
            label = f"{'recompute at the larger' if name == 'larger' else 'plain at the base'} batch"
            said = f"{label}: mean ± sample std over {len(values)} seeds {mean:.6g} ± {std:.3g}"
            spread = {"batch_size": batch_size, "std": std, "n_seeds": len(values), "run_label": label}
            item = f"all seeds batch {batch_size}"
            rows.append(_flagged(item, Role.MEAN, said, metric=f"mean_{task.metric}", value=mean, extra=spread))
    return rows


CHECK = Check(
    larger_batch_experiment,
    (
        Section(
            LARGER_BATCH,
            "The batch that the memory saving buys, trained by the recompute twin to the same accepted-example budget.",
            template="sections/larger-batch-experiment.html.j2",
            plotter=larger_batch_plots,
            required=False,
            flagged=True,
            roles=(Role.REFERENCE, Role.PROBE, Role.BATCH_FOUND, *TRAINED_ROLES, Role.MEAN),
        ),
    ),
    config="larger_batch",
)
