"""The GPU-free estimate's rows of the warm-step memory check (:mod:`reportgen.checks.memory`): at the
measured shape, where it must equal the measurement, and at the target shape of ``memory.estimate``;
per-layer figures beside Korthikanti et al. 2022; each fake twin's step peak. A model that cannot run
on fake tensors gets one INFO row saying what was not estimated and why, in words."""

from __future__ import annotations

import time
from typing import Any

from reportgen.config import MEMORY, MemoryConfig
from reportgen.memory.estimate import (
    Estimate,
    NotEstimableError,
    dropout_mask_bytes,
    estimate_or_reason,
    layernorm_stat_bytes,
)
from reportgen.memory.peak import CATEGORIES, StepPeak, format_bytes, where
from reportgen.memory.saved import SavedActivations
from reportgen.results import Role, Row, Status
from reportgen.twins.setup import Setup


def saving_share(plain_bytes: int, recompute_bytes: int) -> float:
    """Share of the plain run's saved-activation bytes that recomputation saves:
    ``(plain - recompute) / plain`` (0 when plain saves nothing; negative when recompute keeps more)."""
    return (plain_bytes - recompute_bytes) / plain_bytes if plain_bytes else 0.0


def estimate_rows(
    setup: Setup, measured: dict[str, SavedActivations] | None, measured_peaks: dict[str, StepPeak] | None = None
) -> list[Row]:
    """The estimator at the measured shape (must equal the measurement) and at the target shape:
    saved bytes, and the step peak (:func:`estimate_peak_rows`).

    At the measured shape a mismatch is a WARN (the target-scale figure cannot be trusted). A model
    that cannot run on fake tensors gets an INFO row saying what was not estimated and why
    (:class:`reportgen.memory.estimate.NotEstimableError`): the measured figures above stand on their own. An
    estimate run in another precision (``Estimate.dtype_note``) is stated and not compared.
    """
    rows: list[Row] = []
    start = time.perf_counter()
    try:
        here = estimate_or_reason(setup, {})
    except NotEstimableError as exc:
        return [not_estimated_row("estimate at measured shape", exc.reason, time.perf_counter() - start)]
    seconds = time.perf_counter() - start
    if here.dtype_note:
        measured, measured_peaks = None, None
    for variant in ("plain", "recompute"):
        est = getattr(here, variant).total_bytes
        if here.dtype_note:
            rows.append(
                Row(
                    check=MEMORY,
                    item="estimate at measured shape",
                    variant=variant,
                    metric="estimated_saved_activation_bytes",
                    value=est,
                    status=Status.INFO,
                    detail=f"not compared with the measurement: {here.dtype_note}",
                    seconds=seconds,
                    role=Role.ESTIMATE_MEASURED,
                    unit="B",
                    extra={"estimate_inputs": here.inputs},
                )
            )
            continue
        if measured is None:
            rows.append(
                Row(
                    check=MEMORY,
                    item="estimate at measured shape",
                    variant=variant,
                    metric="estimated_saved_activation_bytes",
                    value=est,
                    status=Status.WARN,
                    detail="no measurement to validate the estimator against",
                    seconds=seconds,
                    role=Role.ESTIMATE_MEASURED,
                    unit="B",
                    extra={"estimate_inputs": here.inputs},
                )
            )
            continue
        real = measured[variant].total_bytes
        ratio = est / real if real else float("nan")
        rows.append(
            Row(
                check=MEMORY,
                item="estimate at measured shape",
                variant=variant,
                metric="estimated_saved_activation_bytes",
                value=est,
                threshold="= measured",
                comparator="==",
                seconds=seconds,
                role=Role.ESTIMATE_MEASURED,
                unit="B",
                threshold_value=real,
                on_miss=Status.WARN,
                detail=(
                    "estimate (fake tensors, no allocation) equals the measurement"
                    if est == real
                    else f"estimate differs from the measurement ({est} vs {real} B): "
                    "do not trust the target-shape figure"
                ),
                extra={"measured_bytes": real, "estimate_to_measured_ratio": ratio, "estimate_inputs": here.inputs},
            )
        )
    rows += korthikanti_rows(setup, here, "measured shape")
    rows += estimate_peak_rows(here, "measured shape", seconds, measured_peaks)
    section: MemoryConfig = setup.config.memory
    target = section.estimate
    if not target:
        return rows
    start = time.perf_counter()
    try:
        far = estimate_or_reason(setup, target)
    except NotEstimableError as exc:
        return rows + [not_estimated_row("estimate at target shape", exc.reason, time.perf_counter() - start)]
    seconds = time.perf_counter() - start
    overrides = ", ".join(f"{k}={v}" for k, v in _flat(far.overrides))
    share = saving_share(far.plain.total_bytes, far.recompute.total_bytes)
    for variant in ("plain", "recompute"):
        rows.append(
            Row(
                check=MEMORY,
                item="estimate at target shape",
                variant=variant,
                metric="estimated_saved_activation_bytes",
                value=getattr(far, variant).total_bytes,
                status=Status.INFO,
                seconds=seconds,
                role=Role.ESTIMATE_TARGET,
                unit="B",
                detail=f"inputs {far.inputs}, {far.dtype}; overrides: {overrides}"
                + (f"; {far.dtype_note}" if far.dtype_note else ""),
                extra={"estimate_inputs": far.inputs, "estimate_overrides": overrides, "saving_share": share},
            )
        )
    return rows + korthikanti_rows(setup, far, "target shape") + estimate_peak_rows(far, "target shape", seconds)


#: Largest relative difference of the estimated from the measured step peak at the measured
#: shape (issue 15: "within 1 %"); both count the same tensors, so they agree exactly in practice.
PEAK_ESTIMATE_TOLERANCE = 0.01


def not_estimated_row(item: str, reason: str, seconds: float) -> Row:
    """An INFO row: the GPU-free estimate (``item``) was not made, and ``reason`` (in words) why."""
    return Row(
        check=MEMORY,
        item=item,
        variant="recompute",
        metric="estimated_saved_activation_bytes",
        status=Status.INFO,
        role=Role.ESTIMATE_MEASURED,
        unit="B",
        seconds=seconds,
        detail=f"not estimated: saved activations and step peak on fake tensors (no GPU): {reason}. The measured "
        "figures above stand on their own; the estimate only extrapolates them to other shapes",
    )


def estimate_peak_rows(
    estimate: Estimate, where_: str, seconds: float, measured_peaks: dict[str, StepPeak] | None = None
) -> list[Row]:
    """``estimated_peak_live_bytes`` of both fake twins at one shape (INFO, with phase, module and
    categories), and at the measured shape ``estimated_peak_rel_diff`` per twin, judged
    ``<= PEAK_ESTIMATE_TOLERANCE`` (WARN when missed: do not trust the target-shape peak)."""
    if estimate.plain_peak is None or estimate.recompute_peak is None:
        return [
            Row(
                check=MEMORY,
                item=f"step peak estimate, {where_}",
                variant="recompute",
                metric="estimated_peak_live_bytes",
                status=Status.INFO,
                role=Role.ESTIMATE_PEAK,
                unit="B",
                seconds=seconds,
                detail=f"not estimated: the step peak at the {where_} (fake tensors): {estimate.peak_error}; the "
                "measured step peak stands on its own",
            )
        ]
    rows = []
    for variant in ("plain", "recompute"):
        peak: StepPeak = getattr(estimate, f"{variant}_peak")
        extra: dict[str, Any] = {
            "estimate_inputs": estimate.inputs,
            "estimate_shape": where_,
            "peak_phase": peak.phase,
            "peak_module": peak.module,
            "peak_region": peak.region or "",
            **{f"at_peak_{c.replace(' ', '_')}_bytes": peak.categories[c] for c in CATEGORIES},
        }
        rows.append(
            Row(
                check=MEMORY,
                item=f"step peak estimate, {where_}",
                variant=variant,
                metric="estimated_peak_live_bytes",
                value=peak.peak_bytes,
                status=Status.INFO,
                seconds=seconds,
                role=Role.ESTIMATE_PEAK,
                unit="B",
                extra=extra,
                detail=f"fake tensors, inputs {estimate.inputs}, {estimate.dtype}: reached in {where(peak)}; "
                "allocator fragmentation and caching, communication buffers and CUDA workspaces are "
                "not tensors and not counted",
            )
        )
        if measured_peaks is not None and variant in measured_peaks:
            real = measured_peaks[variant].peak_bytes
            diff = abs(peak.peak_bytes - real) / real if real else float("nan")
            rows.append(
                Row(
                    check=MEMORY,
                    item=f"step peak estimate, {where_}",
                    variant=variant,
                    metric="estimated_peak_rel_diff",
                    value=diff,
                    threshold=f"<= {PEAK_ESTIMATE_TOLERANCE:g} of measured",
                    comparator="<=",
                    role=Role.ESTIMATE_PEAK,
                    unit="share",
                    threshold_value=PEAK_ESTIMATE_TOLERANCE,
                    on_miss=Status.WARN,
                    detail=(
                        f"estimated step peak {format_bytes(peak.peak_bytes)}, measured {format_bytes(real)}"
                        + ("" if diff <= PEAK_ESTIMATE_TOLERANCE else ": do not trust the target-shape peak")
                    ),
                    extra={
                        "estimate_shape": where_,
                        "estimated_peak_bytes": peak.peak_bytes,
                        "measured_peak_bytes": real,
                    },
                )
            )
    return rows


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """``{"model": {"width": 8}, "batch_size": 2}`` → ``[("model.width", 8), ("batch_size", 2)]``."""
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def korthikanti_rows(setup: Setup, estimate: Estimate, where: str) -> list[Row]:
    """Per-layer saved bytes beside Korthikanti et al. 2022 (transformer-shaped models only).

    Plain: ``sbh(16e + 2m) + as²b(2e + m)`` (the paper's ``sbh(34 + 5as/h)`` for e=2, m=1),
    plus LayerNorm statistics the paper leaves out; recompute: ``e·sbh`` (the paper's ``2sbh``).
    """
    shape = estimate.transformer
    if shape is None:
        return []
    e = shape.element_bytes
    m = dropout_mask_bytes(setup.device, e)
    norms = shape.layernorms
    ln_stats = norms * 2 * shape.b * shape.s * layernorm_stat_bytes(setup.device, e)  # mean and rstd, [b, s] each
    symbols = {
        "seq_s": shape.s,
        "batch_b": shape.b,
        "width_h": shape.h,
        "heads_a": shape.a,
        "element_bytes": e,
        "mask_bytes": m,
        "layernorms": norms,
    }
    plain, recompute = estimate.per_layer("plain"), estimate.per_layer("recompute")
    return [
        _per_layer_row(
            where,
            "plain",
            plain,
            symbols,
            shape.formula_bytes(2),
            shape.formula_bytes(e, m),
            ln_stats,
            "median over wrapped modules; Korthikanti et al. 2022 eq. (1) beside it",
        ),
        _per_layer_row(
            where,
            "recompute",
            recompute,
            symbols,
            shape.full_recompute_bytes(2),
            shape.full_recompute_bytes(e),
            0,
            "median over wrapped modules; full recomputation keeps the layer input only (2sbh in 16-bit)",
        ),
    ]


def _per_layer_row(
    where: str,
    variant: str,
    value: float,
    symbols: dict,
    formula_16bit: float,
    formula: float,
    ln_stats: float,
    detail: str,
) -> Row:
    """One twin's estimated saved bytes per layer (B) beside the formula's figure for that twin: the
    16-bit figure as published, the figure at this dtype, and what is left over (``residual_bytes``)."""
    return Row(
        check=MEMORY,
        item=f"per layer, {where}",
        variant=variant,
        metric="estimated_saved_activation_bytes",
        value=value,
        status=Status.INFO,
        role=Role.PER_LAYER,
        unit="B",
        detail=detail,
        extra={
            **symbols,
            "korthikanti_16bit_bytes": formula_16bit,
            "formula_bytes": formula,
            "layernorm_stats_bytes": ln_stats,
            "residual_bytes": value - formula - ln_stats,
            "formula_ratio": value / formula,
        },
    )
