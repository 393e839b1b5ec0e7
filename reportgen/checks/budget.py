"""Task metrics after equal accepted-example budgets (checklist item 5, docs/architecture.md; what and why: the
section's intro in :data:`CHECK`; the training: :mod:`reportgen.training.loop`)."""

from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

from reportgen.checks.base import TRAINED_ROLES, Check, Section
from reportgen.checks.base.plots import task_metric_plots
from reportgen.checks.base.run import Run
from reportgen.config import TASK_METRICS, BudgetConfig, ParityConfig
from reportgen.results import TWIN, Role, Row, Status
from reportgen.results.compared import zero_count_row
from reportgen.results.raised import error_row, exception_message
from reportgen.results.rows import metric_diff_row, trained_params_row
from reportgen.training.lockstep import lockstep_gradients
from reportgen.training.loop import TrainResult
from reportgen.training.rows import run_rows
from reportgen.training.train import budget_run

log = logging.getLogger("reportgen")

VARIANTS = (("plain", False), ("recompute", True))


def describe_optimizer(node: Any) -> str:
    """``AdamW(lr=0.001)`` from a ``_target_`` node, for the report."""
    items = {k: v for k, v in dict(node).items() if k != "_target_"}
    name = str(node.get("_target_", "?")).rsplit(".", 1)[-1]
    return f"{name}({', '.join(f'{k}={v}' for k, v in items.items())})"


def final_params_row(
    setup, seed: int, plain: TrainResult, recompute: TrainResult, rounding: TrainResult | None = None
) -> Row:
    """The trained twins themselves (:func:`reportgen.results.rows.trained_params_row` at the parity
    tolerances): the held-out metric can agree within its tolerance while the weights have
    drifted apart. ``rounding``: the rounding twin trained to the same budget
    (reportgen/rounding.py), whose distance from plain is each parameter's rounding envelope."""
    rtol, atol = setup.tolerance()
    return trained_params_row(
        TASK_METRICS,
        seed,
        plain.final_params,
        recompute.final_params,
        rtol,
        atol,
        setup.config.parity.rounding_factor,
        None if rounding is None else rounding.final_params,
    )


def rounding_run(run: Run, seed: int, batch_size: int, found: dict | None = None) -> TrainResult | None:
    """The rounding twin trained to the same budget, when it is needed and applies: the envelope
    is on (the caller asks only when a trained parameter is outside tolerance), and at every step
    of the budget run the recompute twin's gradients, taken at the plain twin's weights, stay
    within tolerance (:func:`reportgen.training.lockstep.lockstep_gradients`): the envelope models gradient
    noise, so a fault that changes gradients, at once or from any later step, keeps its verdict.
    None otherwise; then ``found["lockstep_step"]`` (when ``found`` is given) is the first step whose
    gradients differ at identical weights."""
    setup = run.setup
    if not setup.config.parity.rounding_envelope:
        return None
    first = lockstep_gradients(setup, seed, batch_size)
    if first is not None:
        if found is not None:
            found["lockstep_step"] = first
        log.info(
            "task metrics, seed %d: gradients at identical weights differ from step %d of the budget run; "
            "the rounding envelope does not apply",
            seed,
            first,
        )
        return None
    return run.budget_runs.get(setup, False, seed, batch_size, rounding=True)


def compare_seed(
    run: Run, seed: int, batch_size: int, results: dict[str, TrainResult]
) -> tuple[list[Row], tuple[int, float, float, float | None]]:
    """One seed's comparison: the metric difference and the trained parameters. When trained
    parameters differ beyond tolerance, they are judged against the rounding twin's envelope too
    (:func:`rounding_run`), and, when that passes them, so is the metric difference. A metric
    difference with every trained parameter within tolerance is never put down to rounding: it
    comes from state the weights do not hold (e.g. BatchNorm running statistics updated twice per
    step), so it keeps its tolerance verdict. The envelope is never measured against a cached twin:
    a plain run from the disk cache is trained afresh first, and the seed is judged on that one.

    Returns:
        The rows (an ERROR row added when the rounding twin raised) and
        ``(seed, |recompute - plain|, allowed, rounding_excess or None)`` for the worst-seed row.
    """
    setup = run.setup
    budget: BudgetConfig = setup.config.budget
    parity: ParityConfig = setup.config.parity
    task = setup.task
    metric = task.metric
    r, cached = results["recompute"].metrics[metric], results["plain"].cache_key

    def judged(plain: TrainResult) -> tuple[float, float, list[Row]]:
        p = plain.metrics[metric]
        allowed = budget.metric_tolerance + budget.metric_rtol * abs(p)
        diff = metric_diff_row(TASK_METRICS, seed, p, r, allowed, metric, task.higher_is_better)
        return p, allowed, [diff, final_params_row(setup, seed, plain, results["recompute"])]

    p, allowed, rows = judged(results["plain"])
    errors = []
    try:
        found: dict = {}
        rounding = rounding_run(run, seed, batch_size, found) if rows[1].status != Status.PASS else None
        if "lockstep_step" in found:  # evidence for the diagnosis: where the fault switches on
            rows[1].detail += (
                f"; gradients taken at identical weights first differ at step {found['lockstep_step']} "
                "of the budget run, so this is not rounding"
            )
            rows[1].extra["lockstep_first_step"] = found["lockstep_step"]
        if rounding is not None and cached:  # the envelope is measured against a plain twin trained in this run
            desc = f"plain seed {seed} batch {batch_size}, for the rounding envelope"
            plain = setup.twin(False, optimizer=budget.optimizer)
            results = {**results, "plain": budget_run(setup, plain, budget, seed, batch_size, desc)}
            p, allowed, rows = judged(results["plain"])
    except Exception as exc:  # failures are data; the rows keep their tolerance verdicts
        log.exception("task metrics: rounding twin, seed %d, raised", seed)
        rounding, errors = None, [error_row(TASK_METRICS, exc, "rounding twin")]
    if rounding is not None:
        final = final_params_row(setup, seed, results["plain"], results["recompute"], rounding)
        if cached:
            final.detail += (
                f"; the plain twin was trained afresh for it (its cache entry sha256:{cached[:16]}… not used)"
            )
        if (
            final.status == Status.PASS
        ):  # the metric may lean on the envelope only when the weights are at rounding level
            envelope = rounding.metrics[metric], parity.rounding_factor
            rows[0] = metric_diff_row(TASK_METRICS, seed, p, r, allowed, metric, task.higher_is_better, *envelope)
        rows = [rows[0], final]
    return rows + errors, (seed, abs(r - p), allowed, rows[0].extra.get("rounding_excess"))


def _train_or_error(
    run: Run, variant: str, recompute: bool, seed: int, batch_size: int
) -> tuple[TrainResult | None, list[Row]]:
    """Train one twin; an exception or an incomplete budget becomes an ERROR row."""
    item, start = f"seed {seed}", time.perf_counter()
    try:
        result = run.budget_runs.get(run.setup, recompute, seed, batch_size)
    except Exception as exc:  # failures are data
        log.exception("task metrics: %s run, seed %d, raised", variant, seed)
        detail = f"the {variant} training run raised {type(exc).__name__}: {exception_message(exc)}" + (
            ": the baseline itself breaks, so this check cannot be judged" if variant == "plain" else ""
        )
        extra = {"seed": seed, "exception_type": type(exc).__name__, TWIN: variant}
        row = Row.fact(TASK_METRICS, item, Role.EXCEPTION, detail, status=Status.ERROR, variant=variant, extra=extra)
        row.seconds = time.perf_counter() - start
        return None, [row]
    if not result.complete:
        examples, cap = run.setup.config.budget.examples, result.steps + result.skipped_steps
        detail = (
            f"budget not reached: only {result.accepted_examples} of {examples} examples accepted after the cap of "
            f"{cap} drawn batches ({result.skipped_steps} skipped for a non-finite loss or gradient); raise "
            "budget.max_steps_factor or fix the data/loss"
        )
        extra = {"seed": seed, "skipped_steps": result.skipped_steps, "batch_size": batch_size, TWIN: variant}
        row = Row.fact(
            TASK_METRICS,
            item,
            Role.ACCEPTED,
            detail,
            status=Status.ERROR,
            metric="accepted_examples",
            value=result.accepted_examples,
            unit="examples",
            variant=variant,
            seconds=result.seconds,
            extra=extra,
        )
        row.threshold = str(examples)  # the budget it fell short of, for people (not judged)
        return None, [row]
    return result, []


def nonfinite_metric_row(seed: int, metric: str, value: float) -> Row:
    """An ERROR of the baseline (``twin`` = plain): the plain twin's held-out metric is NaN or infinite, so
    the seed's metric cannot be compared and the check cannot be judged."""
    detail = (
        f"the plain twin's held-out {metric} is {value}: the baseline itself "
        "computes non-finite values, so this check cannot be judged; fix the model, data or loss first"
    )
    return Row.fact(
        TASK_METRICS,
        f"seed {seed}",
        Role.METRIC_DIFF,
        detail,
        status=Status.ERROR,
        metric=f"abs_diff_{metric}",
        variant="plain",
        extra={"seed": seed, "plain_value": value, TWIN: "plain"},
    )


def task_metrics(run: Run) -> list[Row]:
    """Train plain and recompute twins to equal accepted-example budgets; compare the task metric.

    For each seed in ``cfg.budget.seeds``: both twins from the shared initial ``state_dict``,
    same data order and dropout seeds, ``cfg.budget.examples`` accepted examples at
    ``cfg.budget.batch_size``, optimizer ``cfg.budget.optimizer``.

    Returns:
        Per seed and variant: the task metric, the other held-out metrics, accepted examples,
        skipped steps and learning-curve points (INFO). Per seed: ``abs_diff_<metric>`` judged
        against ``budget.metric_tolerance`` (PASS/FAIL). Per variant: ``mean_<metric>`` with a
        ``std`` column (INFO). One ``worst_abs_diff_<metric>`` row (PASS/FAIL). A seed whose
        twins skipped different numbers of steps gets a WARN row. NOT_RUN when disabled.
    """
    setup = run.setup
    section: BudgetConfig = setup.config.budget
    task = setup.task
    metric, tol, rtol = task.metric, section.metric_tolerance, section.metric_rtol
    bs = section.batch_size
    detail = (
        f"{section.examples} accepted examples per run at batch {bs}, "
        f"optimizer {describe_optimizer(section.optimizer)}, seeds {', '.join(str(s) for s in section.seeds)}; "
        f"learning-curve point every {section.eval_every} accepted "
        f"examples; task metric {metric} ({'higher' if task.higher_is_better else 'lower'} is better), "
        f"tolerance |recompute - plain| <= {tol:g}"
        + (f" + {rtol:g}·|plain|" if rtol else "")
        + "; the trained twins' final parameters are compared too"
    )
    rows = [
        Row.fact(
            TASK_METRICS,
            "budget",
            Role.BUDGET,
            detail,
            metric="budget_examples",
            value=section.examples,
            unit="examples",
            extra={"batch_size": bs},
        )
    ]
    finals: dict[str, list[float]] = {"plain": [], "recompute": []}
    diffs: list[tuple[int, float, float, float | None]] = []
    for seed in section.seeds:
        seed = int(seed)
        results: dict[str, TrainResult] = {}
        for variant, recompute in VARIANTS:
            result, errors = _train_or_error(run, variant, recompute, seed, bs)
            rows += errors
            if result is not None:
                results[variant] = result
                rows += run_rows(TASK_METRICS, variant, f"seed {seed}", seed, result, metric)
                finals[variant].append(result.metrics[metric])
        if len(results) < 2:
            continue
        if not math.isfinite(results["plain"].metrics[metric]):  # no baseline to compare the metric with
            rows.append(nonfinite_metric_row(seed, metric, results["plain"].metrics[metric]))
            continue
        seed_rows, diff = compare_seed(run, seed, bs, results)
        run.budget_runs.drop_weights()  # compared: the larger-batch experiment reads the runs' figures alone
        rows += seed_rows
        diffs.append(diff)
        sp, sr = results["plain"].skipped_steps, results["recompute"].skipped_steps
        if sp != sr:
            said = f"the twins skipped different numbers of steps (plain {sp}, recompute {sr}): they did not see the same updates"
            rows.append(
                zero_count_row(
                    TASK_METRICS,
                    f"seed {seed}",
                    "skipped_steps_diff",
                    sr - sp,
                    "steps",
                    Role.SKIPPED_DIFF,
                    said,
                    on_miss=Status.WARN,
                    extra={"seed": seed},
                )
            )
    for variant, values in finals.items():
        if values:
            mean, std = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
            said = f"mean ± sample std over {len(values)} seeds: {mean:.6g} ± {std:.3g}"
            spread = {"std": std, "n_seeds": len(values)}
            rows.append(
                Row.fact(
                    TASK_METRICS,
                    "all seeds",
                    Role.MEAN,
                    said,
                    metric=f"mean_{metric}",
                    value=mean,
                    variant=variant,
                    extra=spread,
                )
            )
    if diffs:
        seed, worst, allowed, rounding_excess = max(diffs, key=_effective)
        detail = (
            f"the per-seed |recompute - plain| {metric} closest to (or furthest past) its tolerance "
            f"(seed {seed}), over {len(diffs)} seeds"
        )
        if worst > allowed and _effective((seed, worst, allowed, rounding_excess)) <= 0:
            detail += ", within its rounding envelope"
        rows.append(
            Row.measured(
                TASK_METRICS,
                "all seeds",
                f"worst_abs_diff_{metric}",
                worst,
                "",
                comparator="<=",
                threshold_value=allowed,
                threshold=f"{allowed:g}",
                role=Role.WORST,
                detail=detail,
                extra={"seed": seed, **({} if rounding_excess is None else {"rounding_excess": rounding_excess})},
            )
        )
    return rows


def _effective(diff: tuple[int, float, float, float | None]) -> float:
    """How far past passing one seed's metric difference is: ``diff - allowed``, or its
    ``rounding_excess`` when that is smaller (NaN-safe)."""
    _, value, allowed, rounding = diff
    own = value - allowed
    return own if rounding is None or rounding != rounding else min(own, rounding)


CHECK = Check(
    task_metrics,
    (
        Section(
            TASK_METRICS,
            "Gradient parity on one batch is necessary, not sufficient: the claim is about training. Both twins are "
            "trained from the same initial weights on the same data order and seeds until each has accepted the same number of "
            "examples, then evaluated on held-out data. Trained parameters outside tolerance (then the metric) may pass "
            "within the rounding envelope, only if gradients taken at identical weights agree at every step of the budget run.",
            template="sections/task-metrics.html.j2",
            plotter=task_metric_plots,
            roles=(
                Role.BUDGET,
                *TRAINED_ROLES,
                Role.MEAN,
                Role.WORST,
                Role.METRIC_DIFF,
                Role.SKIPPED_DIFF,
                Role.FINAL_PARAMS,
            ),
        ),
    ),
    config="budget",
)
