"""The rows of the warm-step time check (:mod:`reportgen.checks.timing.check`): the median step per twin,
the overhead ratio with its 95% bootstrap CI, whether that CI is narrow enough, the FLOP bound, and
the machine's load while timing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from reportgen.config import TIME
from reportgen.results import Role, Row, Status
from reportgen.results.bootstrap import bootstrap_ratio_ci

VARIANTS = ("plain", "recompute")


def ci_width_row(overhead: Row, target_pp: float, stopped: str) -> Row:
    """Is the overhead's 95% CI narrow enough to trust? ``ci_half_width_pp <= target`` (WARN
    when wider: too noisy, e.g. a busy machine)."""
    half = overhead.extra["ci_half_width_pp"]
    rounds = overhead.extra["rounds"]
    if half <= target_pp:
        detail = f"95% CI half-width ±{half:.1f} pp after {rounds} rounds ({stopped})"
    else:  # the stopping rule computes this same interval (ci_target_reached), so it never stopped on the target
        why = "rounds ended" if "target reached" in stopped else stopped
        detail = (
            f"too noisy to trust: ±{half:.1f} pp is wider than the ±{target_pp:g} pp target after {rounds} "
            f"rounds ({why}); is the machine busy? Rerun on an idle one, or give timing.max_measure_seconds more"
        )
    return Row.measured(
        TIME,
        "overhead confidence",
        "ci_half_width_pp",
        half,
        "pp",
        comparator="<=",
        threshold_value=target_pp,
        threshold=f"<= {target_pp:g} pp",
        on_miss=Status.WARN,
        role=Role.OVERHEAD_CI,
        detail=detail,
    )


def machine_load_row() -> Row | None:
    """The 1-minute load average after timing, beside the CPUs and torch's intra-op threads.

    Timing on a shared machine is unreliable: when other runnable work competes for the cores,
    torch's intra-op threads wait for each other at every parallel op, and steps can take many
    times longer than on an idle machine. WARN when the load exceeds this process's own threads
    by one or more (other work was running); None where the OS has no load average.
    """
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = torch.get_num_threads()
    busy = load - threads >= 1
    detail = f"1-minute load average {load:.2f} on {cpus} CPUs, {threads} torch intra-op threads"
    if busy:
        detail += (
            ": other work shared the CPUs while timing, so step times are inflated and noisier than on an "
            "idle machine; rerun on an idle machine before quoting them"
        )
    extra = {"cpus": cpus, "torch_threads": threads}
    return Row.measured(
        TIME,
        "machine load",
        "load_average",
        load,
        "",
        comparator="<",
        threshold_value=threads + 1,  # threshold for people: "< {threads + 1}", as Row.measured writes it
        on_miss=Status.WARN,
        role=Role.LOAD,
        detail=detail,
        variant="plain",
        extra=extra,
    )


def median_rows(times: dict[str, list[float]], max_step_time_ms: float | None, seconds: float) -> list[Row]:
    """``step_time_ms`` median per variant, spread as extra columns; recompute judged against
    ``max_step_time_ms`` when set."""
    rows = []
    for variant in VARIANTS:
        t = np.asarray(times[variant])
        q25, med, q75 = np.quantile(t, [0.25, 0.5, 0.75])
        extra = {
            "p25_ms": float(q25),
            "p75_ms": float(q75),
            "iqr_ms": float(q75 - q25),
            "min_ms": float(t.min()),
            "max_ms": float(t.max()),
            "measured_steps": len(t),
        }
        deadline = NO_DEADLINE
        detail = f"median of {len(t)} steps; interquartile range {q25:.3g}–{q75:.3g} ms"
        if variant == "recompute" and max_step_time_ms is not None:
            deadline = {
                "threshold": f"{max_step_time_ms:g} ms",
                "comparator": "<=",
                "threshold_value": float(max_step_time_ms),
            }
            over = med - max_step_time_ms
            detail += (
                f"; within the deadline of {max_step_time_ms:g} ms"
                if over <= 0
                else f"; deadline missed: {med:.3g} ms vs {max_step_time_ms:g} ms allowed, "
                f"{over:.3g} ms ({over / max_step_time_ms:.1%}) over"
            )
        took = seconds if variant == "plain" else 0.0
        rows.append(
            Row.measured(
                TIME,
                "median step",
                "step_time_ms",
                float(med),
                "ms",
                role=Role.MEDIAN,
                detail=detail,
                variant=variant,
                seconds=took,
                extra=extra,
                **deadline,
            )
        )
    return rows


#: The deadline of a time figure without one: the ``threshold`` (for people), ``comparator`` and
#: ``threshold_value`` of :meth:`Row.measured` that leave its row INFO, not judged.
NO_DEADLINE: Mapping[str, Any] = {"threshold": "", "comparator": "", "threshold_value": math.nan}


def overhead_row(times: dict[str, list[float]], samples: int, max_ratio: float | None) -> Row:
    """``overhead_ratio`` = median over rounds of recompute/plain, with its 95% bootstrap CI.

    With ``max_ratio`` set the row is judged with comparator ``ci<=``: PASS when the whole CI
    is within it, WARN when the median is within it but the CI reaches past it (not
    conclusive), FAIL when the median misses it. Without it the row is INFO.
    """
    ratio, low, high = bootstrap_ratio_ci(times["plain"], times["recompute"], samples)
    half_pp = (high - low) / 2 * 100
    of_medians = float(np.median(times["recompute"]) / np.median(times["plain"]))
    extra = {
        "ci_low": low,
        "ci_high": high,
        "ci_half_width_pp": half_pp,
        "bootstrap_samples": samples,
        "ratio_of_medians": of_medians,
    }
    detail = f"recompute steps take {ratio - 1:+.1%} vs plain; 95% CI {low:.3f}–{high:.3f} (±{half_pp:.1f} pp)"
    deadline = NO_DEADLINE
    if max_ratio is not None:
        deadline = {"threshold": f"{max_ratio:g}", "comparator": "ci<=", "threshold_value": float(max_ratio)}
        if ratio > max_ratio:
            detail += f"; deadline missed: ratio {ratio:.3f} vs {max_ratio:g} allowed, {ratio - max_ratio:.3f} over"
        elif high > max_ratio:
            detail += f"; median within {max_ratio:g} but the CI reaches {high:.3f}: not conclusive, measure more steps"
        else:
            detail += f"; within the deadline of {max_ratio:g}"
    return Row.measured(
        TIME, "overhead", "overhead_ratio", ratio, "ratio", role=Role.OVERHEAD, detail=detail, extra=extra, **deadline
    )


def flops_row(flops: dict[str, int]) -> Row:
    """``expected_overhead_ratio`` = recompute step FLOPs / plain step FLOPs (one more forward
    of the wrapped regions); NaN when the model has no counted ops."""
    plain, rec = flops["plain"], flops["recompute"]
    ratio = rec / plain if plain else float("nan")
    extra = {"plain_step_flops": plain, "recompute_step_flops": rec, "wrapped_forward_flops": rec - plain}
    detail = (
        f"the recomputed forward of the wrapped regions adds {rec - plain:.3g} FLOPs to a "
        f"{plain:.3g}-FLOP plain step (FlopCounterMode: matmul, convolution, attention)"
    )
    return Row.fact(
        TIME,
        "expected from FLOPs",
        Role.FLOPS,
        detail,
        metric="expected_overhead_ratio",
        value=ratio,
        unit="ratio",
        extra=extra,
    )
