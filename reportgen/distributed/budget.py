"""Task metrics of the sharded twins, trained to the same *global* accepted-example budget (docs/distributed.md):
every rank draws the same global batches and trains on its share, a step is applied on every rank or on none,
and the held-out metric and the full trained parameters are compared as in the single-process check."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from reportgen.config import DIST_TASK_METRICS
from reportgen.distributed.full import full_params
from reportgen.distributed.launch import Group, shard_batch
from reportgen.distributed.wrapping import spread_twin
from reportgen.results import Role, Row
from reportgen.results.raised import raised_in
from reportgen.results.rows import metric_diff_row, trained_params_row
from reportgen.training.loop import Sharding, TrainResult
from reportgen.training.rows import run_rows
from reportgen.training.train import budget_run

VARIANTS = (("plain", False), ("recompute", True))


def all_ranks(flag: bool, group: Group) -> bool:
    """True when ``flag`` is true on every rank (a collective on the control group)."""
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group.control)
    return bool(t.item())


def sharded_run(setup, group: Group, recompute: bool, seed: int) -> TrainResult:
    """One distributed twin trained to ``budget.examples`` global accepted examples (every rank calls it).

    Raises:
        ValueError: ``budget.batch_size`` (or the budget) is not a multiple of the world size.
    """
    cfg, parts = setup.config.budget, group.dp_size  # the data-parallel ranks: TP/CP peers take the same share
    if int(cfg.batch_size) % parts or int(cfg.examples) % parts:
        raise ValueError(
            f"budget.batch_size={cfg.batch_size} and budget.examples={cfg.examples} must both be "
            f"multiples of the {parts} data-parallel ranks so each gets an equal share of each "
            "global batch; set them so"
        )
    twin = spread_twin(setup, group, recompute, optimizer=cfg.optimizer)
    sharding = Sharding(
        share=lambda batch: shard_batch(batch, group.dp_rank, parts),
        agree=lambda finite: all_ranks(finite, group),
        final_params=full_params,
        ranks=group.world_size,
    )
    desc = f"sharded {'recompute' if recompute else 'plain'} seed {seed} rank {group.rank}"
    return budget_run(setup, twin, cfg, seed, cfg.batch_size, desc, sharding=sharding)


def budget_rows(setup, group: Group) -> list[Row]:
    """The distributed task-metrics rows (on rank 0; the other ranks train and return none).

    Returns:
        One INFO row stating the global budget; per seed and twin the run's rows
        (:func:`reportgen.training.rows.run_rows`: metric, held-out metrics, global accepted examples,
        skipped steps, curve); per seed ``abs_diff_<metric>`` judged against
        ``budget.metric_tolerance (+ metric_rtol·|plain|)`` and ``final_params_tolerance_used``
        (every full trained parameter, :func:`reportgen.results.rows.trained_params_row`). NOT_RUN when
        ``budget.enabled`` is false.
    """
    cfg, task = setup.config.budget, setup.task
    if not cfg.enabled:
        return [] if group.rank else [Row.not_run(DIST_TASK_METRICS, "not run: budget.enabled=false", item="budget")]
    chosen = setup.config.distributed.budget_seeds  # null: the first of budget.seeds
    seeds = [int(s) for s in (chosen if chosen is not None else list(cfg.seeds)[:1])]
    results = {}
    for seed in seeds:
        for variant, recompute in VARIANTS:
            with raised_in(variant):
                results[(variant, seed)] = sharded_run(setup, group, recompute, seed)
    if group.rank:
        return []
    share = int(cfg.batch_size) // group.dp_size
    detail = (
        f"{cfg.examples} accepted examples per run counted over all {group.world_size} ranks (global "
        f"batches of {cfg.batch_size}, {share} on each of {group.dp_size} data-parallel ranks; a step is applied "
        "on every rank or none), "
        f"seeds {', '.join(str(s) for s in seeds)} (distributed.budget_seeds"
        f"{'' if chosen is not None else ': null = the first of budget.seeds'})"
    )
    examples: dict[str, Any] = {"metric": "budget_examples", "value": int(cfg.examples), "unit": "examples"}
    rows = [Row.fact(DIST_TASK_METRICS, "budget", Role.BUDGET, detail, **examples)]
    for seed in seeds:
        for variant, _ in VARIANTS:
            rows += run_rows(DIST_TASK_METRICS, variant, f"seed {seed}", seed, results[(variant, seed)], task.metric)
        rows += compare_rows(setup, seed, results[("plain", seed)], results[("recompute", seed)])
    return rows


def compare_rows(setup, seed: int, plain: TrainResult, recompute: TrainResult) -> list[Row]:
    """The seed's metric difference (judged by ``budget.metric_tolerance``) and the worst full
    trained parameter (judged ``allclose`` at the parity tolerances)."""
    metric, cfg = setup.task.metric, setup.config.budget
    p, r = plain.metrics[metric], recompute.metrics[metric]
    allowed = float(cfg.metric_tolerance) + float(cfg.metric_rtol) * abs(p)
    (rtol, atol), factor = setup.tolerance(), float(setup.config.parity.rounding_factor)
    return [
        metric_diff_row(DIST_TASK_METRICS, seed, p, r, allowed, metric, setup.task.higher_is_better),
        trained_params_row(DIST_TASK_METRICS, seed, plain.final_params, recompute.final_params, rtol, atol, factor),
    ]
