"""The rows of one training run (task-metrics check, larger-batch experiment, sharded budget runs)."""

from __future__ import annotations

import math

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
    run = {
        **common,
        "accepted_examples": result.accepted_examples,
        "steps": result.steps,
        "skipped_steps": result.skipped_steps,
        "lr": result.lr,
    }
    cached = f"; from the plain-twin cache (key sha256:{result.cache_key})" if result.cache_key else ""
    rows = [
        Row(
            check=check,
            item=item,
            variant=variant,
            metric=metric,
            value=result.metrics[metric],
            threshold="",
            comparator="",
            status=status,
            detail=f"{result.accepted_examples} accepted examples in {result.steps} steps of batch {result.batch_size}, "
            f"lr {result.lr:g}{cached}",
            seconds=result.seconds,
            extra={**run, **({"cache_key": result.cache_key} if result.cache_key else {})},
            role=Role.RUN,
        )
    ]
    if result.cache_rejected:
        rejected_key, why = result.cache_rejected
        rows.append(
            Row(
                check=check,
                item=item,
                variant=variant,
                metric="cache_entry_rejected",
                value=math.nan,
                threshold="",
                comparator="",
                status=Status.FLAGGED
                if status == Status.FLAGGED
                else Status.WARN,  # every row of a flagged experiment is FLAGGED
                detail=f"the plain-twin cache entry under this run's key (sha256:{rejected_key[:16]}…) was not used: "
                f"{why}; the plain twin was trained afresh in this run and the entry replaced",
                extra={**common, "cache_key": rejected_key, "cache_problem": why},
                role=Role.CACHE,
            )
        )
    rows += [
        Row(
            check=check,
            item=item,
            variant=variant,
            metric=name,
            value=value,
            threshold="",
            comparator="",
            status=status,
            detail="held-out, same data as the task metric",
            extra=dict(common),
            role=Role.HELD_OUT,
        )
        for name, value in sorted(result.metrics.items())
        if name != metric
    ]
    skip_detail = (
        (
            f"{result.skipped_steps} steps ({result.skipped_examples} examples) skipped for a non-finite loss "
            "or gradient; their examples are not accepted"
        )
        if result.skipped_steps
        else "no step skipped"
    )
    rows.append(
        Row(
            check=check,
            item=item,
            variant=variant,
            metric="accepted_examples",
            value=result.accepted_examples,
            threshold="",
            comparator="",
            status=status,
            detail=f"examples whose update was applied; {result.steps} applied steps",
            extra=dict(common),
            role=Role.ACCEPTED,
            unit="examples",
        )
    )
    rows.append(
        Row(
            check=check,
            item=item,
            variant=variant,
            metric="skipped_steps",
            value=result.skipped_steps,
            threshold="",
            comparator="",
            status=status,
            detail=skip_detail,
            extra={**common, "skipped_examples": result.skipped_examples},
            role=Role.SKIPPED,
            unit="steps",
        )
    )
    rows += [
        Row(
            check=check,
            item=item,
            variant=variant,
            metric=f"curve_{metric}",
            value=value,
            threshold="",
            comparator="",
            status=status,
            detail="learning-curve point",
            extra={**common, "accepted_examples": n},
            role=Role.CURVE,
        )
        for n, value in result.curve
    ]
    return rows
