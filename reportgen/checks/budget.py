"""Task metrics after equal accepted-example budgets (checklist item 5, docs/architecture.md).

Gradient parity on one batch is necessary, not sufficient: the release claim is about
training. For each seed, the plain and the recompute twin are trained from the same initial
weights, on the same data order with the same dropout seeds, until each has accepted
``budget.examples`` examples (see :mod:`reportgen.train`); then the task metric is evaluated
on held-out data. The check *measures* each seed's metric difference; the condition
``|recompute - plain| <= budget.metric_tolerance`` *judges* it.
"""
from __future__ import annotations

import logging
import math
import statistics
import time
from typing import Any

from ..config import TASK_METRICS
from ..plots import task_metric_plots
from ..results import ERROR, INFO, NOT_RUN, WARN, Role, Row
from ..rows import tensor_row
from ..train import TrainResult, run_rows
from .base import Check, Section

log = logging.getLogger("reportgen")

VARIANTS = (("plain", False), ("recompute", True))


def describe_optimizer(node: Any) -> str:
    """``AdamW(lr=0.001)`` from a ``_target_`` node, for the report."""
    items = {k: v for k, v in dict(node).items() if k != "_target_"}
    name = str(node.get("_target_", "?")).rsplit(".", 1)[-1]
    return f"{name}({', '.join(f'{k}={v}' for k, v in items.items())})"


def difference_detail(plain: float, recompute: float, metric: str, higher_is_better: bool) -> str:
    """One sentence on what recompute did to the metric, e.g. ``recompute is worse by 0.012 (+3.1%)``."""
    if plain == recompute:
        return f"identical: {metric} {plain:.6g} in both runs"
    delta = recompute - plain
    better = (delta > 0) == bool(higher_is_better)
    rel = f" ({delta / abs(plain):+.2%} of plain)" if plain else ""
    return (f"plain {plain:.6g}, recompute {recompute:.6g}: recompute is {'better' if better else 'worse'} "
            f"by {abs(delta):.3g}{rel}")


def final_params_row(setup, seed: int, plain: TrainResult, recompute: TrainResult) -> Row:
    """The trained twins themselves: every final parameter of the recompute twin against the
    plain twin's, at the parity tolerances (``allclose`` on the worst excess). The held-out
    metric can agree within its tolerance while the weights have drifted apart."""
    rtol, atol = setup.tolerance()
    rows = [tensor_row(TASK_METRICS, name, plain.final_params.get(name), recompute.final_params.get(name), rtol, atol)
            for name in sorted(set(plain.final_params) | set(recompute.final_params))]
    worst = max(rows, key=lambda r: r.extra["excess"] if r.extra["excess"] == r.extra["excess"] else math.inf)
    rel = max((r.extra.get("max_rel_err", math.inf) for r in rows), default=0.0)
    moved = [r.item for r in rows if not r.extra["excess"] <= 0]
    detail = (f"all {len(rows)} trained parameters within tolerance; largest relative difference {rel:.3g}" if not moved
              else f"{len(moved)} of {len(rows)} trained parameters differ beyond tolerance (worst {worst.item}, "
                   f"max abs {worst.value:.3g}, largest relative difference {rel:.3g}): the twins trained apart")
    return Row(TASK_METRICS, f"seed {seed}", "recompute", "final_params_max_rel_err", rel, worst.threshold, "allclose",
               detail=detail, role=Role.FINAL_PARAMS,
               extra={"seed": seed, "excess": worst.extra["excess"], "worst_item": worst.item, "items": len(rows),
                      "items_outside": len(moved)})


def _train_or_error(setup, variant: str, recompute: bool, seed: int, batch_size: int) -> tuple[TrainResult | None, list[Row]]:
    """Train one twin; an exception or an incomplete budget becomes an ERROR row."""
    item, start = f"seed {seed}", time.perf_counter()
    try:
        result = setup.budget_runs.get(setup, recompute, seed, batch_size)
    except Exception as exc:  # noqa: BLE001 - failures are data
        log.exception("task metrics: %s run, seed %d, raised", variant, seed)
        return None, [Row(TASK_METRICS, item, variant, "exception", math.nan, "", "", ERROR,
                          f"the {variant} training run raised {type(exc).__name__}: {exc}", time.perf_counter() - start,
                          extra={"seed": seed}, role=Role.EXCEPTION)]
    if not result.complete:
        cap = result.steps + result.skipped_steps
        return None, [Row(TASK_METRICS, item, variant, "accepted_examples", result.accepted_examples,
                          str(setup.cfg.budget.examples), "", ERROR,
                          f"budget not reached: only {result.accepted_examples} of {setup.cfg.budget.examples} examples "
                          f"accepted after the cap of {cap} drawn batches ({result.skipped_steps} skipped for a "
                          "non-finite loss or gradient); raise budget.max_steps_factor or fix the data/loss",
                          result.seconds, extra={"seed": seed, "skipped_steps": result.skipped_steps,
                                                 "batch_size": batch_size}, role=Role.ACCEPTED, unit="examples")]
    return result, []


def task_metrics(setup) -> list[Row]:
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
    cfg, task = setup.cfg.budget, setup.task
    metric, tol, rtol = task.metric, float(cfg.metric_tolerance), float(cfg.metric_rtol)
    if not cfg.enabled:
        return [Row(TASK_METRICS, "budget", "recompute", f"abs_diff_{metric}", math.nan, "", "", NOT_RUN,
                    "disabled by budget.enabled=false", role=Role.DISABLED)]
    bs = int(cfg.batch_size)
    rows = [Row(TASK_METRICS, "budget", "recompute", "budget_examples", int(cfg.examples), "", "", INFO,
                f"{cfg.examples} accepted examples per run at batch {bs}, optimizer {describe_optimizer(cfg.optimizer)}, "
                f"seeds {', '.join(str(s) for s in cfg.seeds)}; learning-curve point every {cfg.eval_every} accepted "
                f"examples; task metric {metric} ({'higher' if task.higher_is_better else 'lower'} is better), "
                f"tolerance |recompute - plain| <= {tol:g}" + (f" + {rtol:g}·|plain|" if rtol else "") +
                "; the trained twins' final parameters are compared too",
                extra={"batch_size": bs}, role=Role.BUDGET, unit="examples")]
    finals: dict[str, list[float]] = {"plain": [], "recompute": []}
    diffs: list[tuple[int, float, float]] = []
    for seed in cfg.seeds:
        seed = int(seed)
        results: dict[str, TrainResult] = {}
        for variant, recompute in VARIANTS:
            result, errors = _train_or_error(setup, variant, recompute, seed, bs)
            rows += errors
            if result is not None:
                results[variant] = result
                rows += run_rows(TASK_METRICS, variant, f"seed {seed}", seed, result, metric)
                finals[variant].append(result.metrics[metric])
        if len(results) < 2:
            continue
        p, r = results["plain"].metrics[metric], results["recompute"].metrics[metric]
        diff = abs(r - p)
        diffs.append((seed, diff, tol))
        allowed = tol + rtol * abs(p)
        diffs[-1] = (seed, diff, allowed)
        rows.append(Row(TASK_METRICS, f"seed {seed}", "recompute", f"abs_diff_{metric}", diff, f"{allowed:g}", "<=",
                        detail=difference_detail(p, r, metric, task.higher_is_better), role=Role.METRIC_DIFF,
                        threshold_value=allowed, extra={"seed": seed, "plain_value": p, "recompute_value": r}))
        rows.append(final_params_row(setup, seed, results["plain"], results["recompute"]))
        sp, sr = results["plain"].skipped_steps, results["recompute"].skipped_steps
        if sp != sr:
            rows.append(Row(TASK_METRICS, f"seed {seed}", "recompute", "skipped_steps_diff", sr - sp, "0", "==",
                            detail=f"the twins skipped different numbers of steps (plain {sp}, recompute {sr}): they did "
                            "not see the same updates", extra={"seed": seed}, role=Role.SKIPPED_DIFF, unit="steps",
                            threshold_value=0.0, on_miss=WARN))
    for variant, values in finals.items():
        if values:
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            rows.append(Row(TASK_METRICS, "all seeds", variant, f"mean_{metric}", statistics.fmean(values), "", "", INFO,
                            f"mean ± sample std over {len(values)} seeds: {statistics.fmean(values):.6g} ± {std:.3g}",
                            extra={"std": std, "n_seeds": len(values)}, role=Role.MEAN))
    if diffs:
        seed, worst, allowed = max(diffs, key=lambda d: d[1] - d[2])
        rows.append(Row(TASK_METRICS, "all seeds", "recompute", f"worst_abs_diff_{metric}", worst, f"{allowed:g}", "<=",
                        detail=f"the per-seed |recompute - plain| {metric} closest to (or furthest past) its tolerance "
                               f"(seed {seed}), over {len(diffs)} seeds",
                        extra={"seed": seed}, role=Role.WORST, threshold_value=allowed))
    return rows


CHECK = Check(task_metrics, (Section(
    TASK_METRICS, "Gradient parity on one batch is necessary, not sufficient: the claim is about training. Both twins are "
    "trained from the same initial weights on the same data order and seeds until each has accepted the same number of "
    "examples, then evaluated on held-out data.", template="sections/task-metrics.html.j2", plotter=task_metric_plots),))
