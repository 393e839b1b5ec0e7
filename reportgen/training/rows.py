"""The rows of one training run (task-metrics check, larger-batch experiment, sharded budget runs)."""

from __future__ import annotations

import math
from typing import Any

from reportgen.results import Role, Row, Status
from reportgen.training.loop import TrainResult


def run_rows(
    check: str, variant: str, item: str, seed: int, result: TrainResult, metric: str, status: str = Status.INFO
) -> list[Row]:
    """Rows of one training run: every held-out metric, accepted examples, skipped steps, and
    learning-curve points (metric ``curve_<metric>``, column ``accepted_examples``).

    Args:
        check: check name for the ``check`` column.
        variant: ``plain``, ``recompute`` or ``larger_batch``.
        item: e.g. ``"seed 0"``.
        seed: the run's seed (``seed`` column).
        result: the finished run.
        metric: the task's primary metric name (e.g. ``accuracy``).
        status: status of every row (INFO here; FLAGGED in the larger-batch experiment).

    Returns:
        Rows; the primary metric's row carries ``steps``, ``skipped_steps``, ``lr`` columns. A plain
        run trained because its cache entry was rejected adds a ``cache_entry_rejected`` row
        (``Role.CACHE``; WARN, or FLAGGED inside the flagged experiment).
    """
    common = {"seed": seed, "batch_size": result.batch_size}
    run: dict[str, Any] = {
        **common,
        "accepted_examples": result.accepted_examples,
        "steps": result.steps,
        "skipped_steps": result.skipped_steps,
        "lr": result.lr,
    }
    cached = (
        f"; from the plain-twin cache (key sha256:{result.cache_key}), proven in {result.cache_proof_seconds:.2f} s "
        f"by its first step, its {result.cache_draws} training batches drawn again and one evaluation of its weights, "
        "each bitwise equal to what it stored"
        if result.cache_key
        else ""
    )

    def fact(role: str, metric: str, value: float, detail: str, extra: dict, **more: Any) -> Row:
        more = {"status": status, "variant": variant, **more}
        return Row.fact(check, item, role, detail, metric=metric, value=value, extra=extra, **more)

    run_detail = f"{result.accepted_examples} accepted examples in {result.steps} steps of batch {result.batch_size}"
    proof = {"cache_proof_seconds": result.cache_proof_seconds, "cache_draws": result.cache_draws}
    run |= {"cache_key": result.cache_key, **proof} if result.cache_key else {}
    run_detail += f", lr {result.lr:g}{cached}"
    rows = [fact(Role.RUN, metric, result.metrics[metric], run_detail, run, seconds=result.seconds)]
    if result.cache_rejected:
        rejected_key, why = result.cache_rejected
        detail = (
            f"the plain-twin cache entry under this run's key (sha256:{rejected_key[:16]}…) was not used: "
            f"{why}; the plain twin was trained afresh in this run and the entry replaced"
        )
        flag = Status.FLAGGED if status == Status.FLAGGED else Status.WARN  # a flagged experiment's rows are FLAGGED
        extra = {**common, "cache_key": rejected_key, "cache_problem": why}
        rows.append(fact(Role.CACHE, "cache_entry_rejected", math.nan, detail, extra, status=flag))
    held_out = "held-out, same data as the task metric"
    rows += [fact(Role.HELD_OUT, k, v, held_out, common) for k, v in sorted(result.metrics.items()) if k != metric]
    skipped = (
        f"{result.skipped_steps} steps ({result.skipped_examples} examples) skipped for a non-finite loss "
        "or gradient; their examples are not accepted"
    )
    skip_detail = skipped if result.skipped_steps else "no step skipped"
    applied = f"examples whose update was applied; {result.steps} applied steps"
    rows.append(fact(Role.ACCEPTED, "accepted_examples", result.accepted_examples, applied, common, unit="examples"))
    skip_extra = {**common, "skipped_examples": result.skipped_examples}
    rows.append(fact(Role.SKIPPED, "skipped_steps", result.skipped_steps, skip_detail, skip_extra, unit="steps"))
    curve, point = f"curve_{metric}", "learning-curve point"
    rows += [fact(Role.CURVE, curve, v, point, {**common, "accepted_examples": n}) for n, v in result.curve]
    return rows
