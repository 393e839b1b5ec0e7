"""Warm-step memory (checklist item 3, docs/architecture.md): what recomputation saves, and whether it is real.

Four measurements, each in runs of their own (saved-tensor hooks change what autograd
stores, so nothing here shares a run with the parity checks):

1. **Saved activations, any device.** Bytes of the tensors autograd keeps for backward,
   plain vs recompute, per wrapped module and for the rest of the model
   (:func:`reportgen.measure.saved_activation_bytes`). A saving below
   ``memory.negligible_saving_share`` of the plain figure is a WARN: recomputation is on but
   buys almost nothing (e.g. a target that matches only a tiny module).
2. **Lost gradients.** A saving is only real if the recompute twin still computes every
   gradient the plain twin does; parameters whose gradient vanishes (the reentrant
   frozen-input fault) make the saving a FAIL.
3. **CUDA allocator peaks.** On CUDA only: optimizer state initialised by ``warm_steps``
   steps on the same batch shape, ``torch.cuda.reset_peak_memory_stats`` immediately before
   the measured step, synchronize, then ``max_memory_allocated`` and ``max_memory_reserved``
   (reserved = held by the caching allocator, allocated or not). Elsewhere one row says they
   were not measured; there are never zeros.
4. **GPU-free estimate.** The same counter on ``FakeTensorMode`` tensors
   (:mod:`reportgen.estimate`): at the measured shape, where it must equal the measurement,
   and at the target shape of ``memory.estimate``; transformer-shaped models also get the
   per-layer Korthikanti et al. 2022 figure.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable

from ..config import MEMORY
from ..estimate import Estimate, dropout_mask_bytes, estimate_saved_activations, layernorm_stat_bytes
from ..measure import REST, SavedActivations, cuda_step_peaks, saved_activation_bytes
from ..plots import memory_plots
from ..results import ERROR, INFO, NOT_RUN, WARN, Role, Row
from ..setup import Setup, forward_backward
from ..structure import describe
from .base import Check, Section

VARIANTS = (("plain", False), ("recompute", True))


def warm_step_memory(setup: Setup) -> list[Row]:
    """Run the four memory measurements; each part that raises becomes a row, the rest still run.

    Returns:
        Rows of check ``warm-step memory``: ``saved_activation_bytes`` (total and per module,
        plain and recompute), ``lost_gradients``, ``peak_allocated_bytes`` /
        ``peak_reserved_bytes`` (CUDA) and ``estimated_saved_activation_bytes``.
    """
    mc = setup.cfg.memory
    if not mc.enabled:
        return [Row(MEMORY, "warm-step memory", "recompute", "saved_activation_bytes", status=NOT_RUN, role=Role.DISABLED,
                    detail="memory.enabled=false: no memory figure was measured")]
    rows: list[Row] = []
    measured = _guarded(rows, "saved activations", ERROR, lambda: measure_saved(setup))
    if measured is not None:
        rows += saved_rows(setup, *measured)
    _guarded(rows, "gradients behind the saving", WARN, lambda: rows.extend(lost_gradient_rows(setup)))
    _guarded(rows, "CUDA allocator peaks", ERROR, lambda: rows.extend(cuda_peak_rows(setup)))
    _guarded(rows, "estimate at measured shape", WARN,
             lambda: rows.extend(estimate_rows(setup, measured[0] if measured else None)))
    return rows


def _guarded(rows: list[Row], item: str, status: str, fn: Callable[[], Any]) -> Any:
    """Call ``fn``; an exception becomes a row of ``status`` (ERROR for a required figure, WARN
    for a cross-check such as the estimate) and the result is None."""
    start = time.perf_counter()
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - failures are data
        rows.append(Row(MEMORY, item, "recompute", "exception", status=status, seconds=time.perf_counter() - start,
                        role=Role.EXCEPTION,
                        detail=f"not measured: {type(exc).__name__}: {exc}"))
        return None


def measure_saved(setup: Setup) -> tuple[dict[str, SavedActivations], dict[str, float]]:
    """Saved activations of fresh plain and recompute twins on the fixed batch.

    Returns:
        ``({variant: SavedActivations}, {variant: seconds})``.
    """
    paths = [w.path for w in setup.wrapped]
    saved, seconds = {}, {}
    for variant, recompute in VARIANTS:
        start = time.perf_counter()
        model = setup.build(recompute)
        saved[variant] = saved_activation_bytes(model, setup.batch, setup.task.loss, setup.cfg.forward_seed, paths)
        seconds[variant] = time.perf_counter() - start
        del model
    return saved, seconds


def saving_share(plain_bytes: int, recompute_bytes: int) -> float:
    """Share of the plain run's saved-activation bytes that recomputation saves:
    ``(plain - recompute) / plain`` (0 when plain saves nothing; negative when recompute keeps more)."""
    return (plain_bytes - recompute_bytes) / plain_bytes if plain_bytes else 0.0


def saved_rows(setup: Setup, saved: dict[str, SavedActivations], seconds: dict[str, float]) -> list[Row]:
    """Total and per-module ``saved_activation_bytes`` rows (INFO), and the ``saving_share`` row,
    judged ``>= memory.negligible_saving_share`` (WARN when below: the saving is negligible)."""
    share_min = float(setup.cfg.memory.negligible_saving_share)
    plain, rec = saved["plain"], saved["recompute"]
    share = saving_share(plain.total_bytes, rec.total_bytes)
    shape = f"batch {describe(setup.batch[0])}"
    if share >= share_min:
        sentence = f"recompute keeps {1 - share:.1%} of the plain run's saved activations (saves {share:.1%})"
    else:
        why = ("recompute keeps more than the plain run" if rec.total_bytes > plain.total_bytes
               else f"recompute saves only {share:.1%} of the plain run's saved activations")
        sentence = (f"negligible saving: {why} (threshold {share_min:.0%}); recomputation is applied but buys almost "
                    "nothing, check recompute.targets")
    rows = [
        Row(MEMORY, "saved activations (total)", variant, "saved_activation_bytes", s.total_bytes, status=INFO,
            detail=f"{s.storages} storages kept for backward after one forward and the loss, {shape}",
            seconds=seconds[variant], role=Role.SAVED_TOTAL, unit="B", extra={"storages": s.storages})
        for variant, s in (("plain", plain), ("recompute", rec))]
    rows.append(Row(MEMORY, "saving", "recompute", "saving_share", share, f">= {share_min:g} of plain", ">=",
                    detail=sentence, role=Role.SAVING, unit="share", threshold_value=share_min, on_miss=WARN,
                    extra={"saving_bytes": plain.total_bytes - rec.total_bytes, "plain_bytes": plain.total_bytes,
                           "recompute_bytes": rec.total_bytes}))
    for order, path in enumerate(plain.per_module):
        for variant, s in (("plain", plain), ("recompute", rec)):
            what = "saved outside every wrapped module" if path == REST else f"saved while {path} runs, or its inputs"
            rows.append(Row(MEMORY, f"module {path}", variant, "saved_activation_bytes", s.per_module[path], status=INFO,
                            detail=what, role=Role.SAVED_MODULE, unit="B",
                            extra={"module": path, "module_order": order, "storages": s.per_module_storages.get(path, 0)}))
    return rows


def lost_gradient_rows(setup: Setup) -> list[Row]:
    """FAIL when a trainable parameter has a gradient in the plain run and None under recompute:
    that saving comes from activations that are never needed because gradients were lost."""
    start = time.perf_counter()
    plain_model, recompute_model = setup.twins()
    run = lambda m: forward_backward(m, setup.batch, setup.task.loss, setup.cfg.forward_seed)  # noqa: E731
    with warnings.catch_warnings():  # torch's warnings are reported by gradient parity, not repeated here
        warnings.simplefilter("ignore")
        plain, rec = run(plain_model), run(recompute_model)
    lost = sorted(n for n, g in plain.grads.items() if g is not None and rec.grads.get(n) is None)
    if lost:
        names = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
        detail = (f"the saving is not real: {len(lost)} parameter(s) get a gradient in the plain run and none under "
                  f"recompute ({names}); their activations are not kept because they are never used")
    else:
        detail = "every parameter with a gradient in the plain run has one under recompute"
    return [Row(MEMORY, "gradients behind the saving", "recompute", "lost_gradients", float(len(lost)), "0", "==",
                detail=detail, seconds=time.perf_counter() - start, role=Role.LOST_GRADIENTS, unit="parameters",
                threshold_value=0.0)]


def cuda_peak_rows(setup: Setup) -> list[Row]:
    """``peak_allocated_bytes`` and ``peak_reserved_bytes`` per variant on CUDA; elsewhere one
    INFO row that says they were not measured (value NaN, never 0)."""
    if setup.device.type != "cuda":
        return [Row(MEMORY, "CUDA allocator peaks", "plain", "peak_allocated_bytes", float("nan"), status=INFO,
                    role=Role.NOTE,
                    detail=f"not measured: this run is on {setup.device.type}, and allocator peaks exist only on CUDA. "
                           "The saved-activation bytes above are exact on every device.")]
    warm = int(setup.cfg.memory.warm_steps)
    rows = []
    for variant, recompute in VARIANTS:
        start = time.perf_counter()
        peaks = cuda_step_peaks(setup, recompute, warm)
        gap = peaks["peak_reserved_bytes"] - peaks["peak_allocated_bytes"]
        extra = {"baseline_allocated_bytes": peaks["baseline_allocated_bytes"], "reserved_gap_bytes": gap,
                 "warm_steps": warm}
        seconds = time.perf_counter() - start
        rows.append(Row(MEMORY, "CUDA step peak", variant, "peak_allocated_bytes", peaks["peak_allocated_bytes"],
                        status=INFO, seconds=seconds, extra=extra, role=Role.CUDA_PEAK, unit="B",
                        detail=f"peak of tensors allocated during the step after {warm} warm step(s); "
                               f"{peaks['baseline_allocated_bytes']} B were allocated before it (weights, optimizer state)"))
        rows.append(Row(MEMORY, "CUDA step peak", variant, "peak_reserved_bytes", peaks["peak_reserved_bytes"],
                        status=INFO, extra=extra, role=Role.CUDA_PEAK, unit="B",
                        detail=f"peak held by the caching allocator, {gap} B above the allocated peak"))
    return rows


def estimate_rows(setup: Setup, measured: dict[str, SavedActivations] | None) -> list[Row]:
    """The estimator at the measured shape (must equal the measurement) and at the target shape.

    At the measured shape a mismatch is a WARN (the target-scale figure cannot be trusted); an
    estimator that cannot run is a WARN too: the measured figures above stand on their own.
    """
    rows: list[Row] = []
    start = time.perf_counter()
    here = estimate_saved_activations(setup, {})
    seconds = time.perf_counter() - start
    for variant in ("plain", "recompute"):
        est = getattr(here, variant).total_bytes
        if measured is None:
            rows.append(Row(MEMORY, "estimate at measured shape", variant, "estimated_saved_activation_bytes", est,
                            status=WARN, detail="no measurement to validate the estimator against", seconds=seconds,
                            role=Role.ESTIMATE_MEASURED, unit="B",
                            extra={"estimate_inputs": here.inputs}))
            continue
        real = measured[variant].total_bytes
        ratio = est / real if real else float("nan")
        rows.append(Row(MEMORY, "estimate at measured shape", variant, "estimated_saved_activation_bytes", est,
                        threshold="= measured", comparator="==", seconds=seconds, role=Role.ESTIMATE_MEASURED,
                        unit="B", threshold_value=real, on_miss=WARN,
                        detail=("estimate (fake tensors, no allocation) equals the measurement" if est == real else
                                f"estimate differs from the measurement ({est} vs {real} B): do not trust the target-shape figure"),
                        extra={"measured_bytes": real, "estimate_to_measured_ratio": ratio, "estimate_inputs": here.inputs}))
    rows += korthikanti_rows(setup, here, "measured shape")
    target = setup.cfg.memory.estimate
    if not target:
        return rows
    start = time.perf_counter()
    far = estimate_saved_activations(setup, target)
    seconds = time.perf_counter() - start
    overrides = ", ".join(f"{k}={v}" for k, v in _flat(far.overrides))
    share = saving_share(far.plain.total_bytes, far.recompute.total_bytes)
    for variant in ("plain", "recompute"):
        rows.append(Row(MEMORY, "estimate at target shape", variant, "estimated_saved_activation_bytes",
                        getattr(far, variant).total_bytes, status=INFO, seconds=seconds, role=Role.ESTIMATE_TARGET, unit="B",
                        detail=f"inputs {far.inputs}, {far.dtype}; overrides: {overrides}",
                        extra={"estimate_inputs": far.inputs, "estimate_overrides": overrides, "saving_share": share}))
    return rows + korthikanti_rows(setup, far, "target shape")


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
    symbols = {"seq_s": shape.s, "batch_b": shape.b, "width_h": shape.h, "heads_a": shape.a, "element_bytes": e, "mask_bytes": m,
               "layernorms": norms}
    plain = estimate.per_layer("plain")
    formula = shape.formula_bytes(e, m)
    rows = [Row(MEMORY, f"per layer, {where}", "plain", "estimated_saved_activation_bytes", plain, status=INFO,
                role=Role.PER_LAYER, unit="B",
                detail="median over wrapped modules; Korthikanti et al. 2022 eq. (1) beside it",
                extra={**symbols, "korthikanti_16bit_bytes": shape.formula_bytes(2), "formula_bytes": formula,
                       "layernorm_stats_bytes": ln_stats, "residual_bytes": plain - formula - ln_stats,
                       "formula_ratio": plain / formula})]
    rec = estimate.per_layer("recompute")
    full = shape.full_recompute_bytes(e)
    rows.append(Row(MEMORY, f"per layer, {where}", "recompute", "estimated_saved_activation_bytes", rec, status=INFO,
                    role=Role.PER_LAYER, unit="B",
                    detail="median over wrapped modules; full recomputation keeps the layer input only (2sbh in 16-bit)",
                    extra={**symbols, "korthikanti_16bit_bytes": shape.full_recompute_bytes(2), "formula_bytes": full,
                           "layernorm_stats_bytes": 0, "residual_bytes": rec - full, "formula_ratio": rec / full}))
    return rows


CHECK = Check(warm_step_memory, (Section(
    MEMORY, "What recomputation saves, and whether the saving is real: bytes autograd keeps for backward (exact on any "
    "device, per wrapped module), CUDA allocator peaks where there is CUDA, and a GPU-free estimate at the target shape.",
    template="sections/warm-step-memory.html.j2", plotter=memory_plots),))
