"""Warm-step memory (checklist item 3, docs/architecture.md): what recomputation saves, and whether it is real.

Five measurements, each in runs of their own (saved-tensor hooks change what autograd
stores, so nothing here shares a run with the parity checks):

1. **Saved activations, any device.** Bytes of the tensors autograd keeps for backward,
   plain vs recompute, per wrapped module and for the rest of the model
   (:func:`reportgen.memory.saved.saved_activation_bytes`). A saving below
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
   (:mod:`reportgen.memory.estimate`): at the measured shape, where it must equal the measurement,
   and at the target shape of ``memory.estimate``; transformer-shaped models also get the
   per-layer Korthikanti et al. 2022 figure. Both shapes also give each fake twin's step peak.
5. **Step peak, any device: the verdict.** Peak of live tensor bytes through one warm step
   (forward, backward, optimizer step) of each twin, counted with torch's ``MemTracker``
   (:mod:`reportgen.memory.peak`), with the phase and module at the peak and what is alive then by
   category; on CUDA the allocator's peaks of the same step beside it. The verdict row
   (``peak_saving_share``) needs recompute to lower the peak by ``memory.min_peak_saving_share``
   of the plain peak (``memory.peak_on_miss`` when it does not) and names the cause when it does
   not: one region recomputed whole, a peak in the optimizer step, or an increase and the
   wrapped modules that cause it.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable

from reportgen.config import MEMORY
from reportgen.memory.estimate import Estimate, dropout_mask_bytes, estimate_saved_activations, layernorm_stat_bytes
from reportgen.memory.saved import REST, SavedActivations, cuda_step_peaks, saved_activation_bytes, training_optimizer
from reportgen.memory.peak import CATEGORIES, StepPeak, format_bytes, increase_cause, peak_sentence, warm_step_peak, where
from reportgen.checks.plots import memory_plots
from reportgen.results import ERROR, INFO, WARN, Role, Row
from reportgen.twins.setup import Setup, forward_backward
from reportgen.structure import describe
from reportgen.checks.base import Check, Section

VARIANTS = (("plain", False), ("recompute", True))


def warm_step_memory(setup: Setup) -> list[Row]:
    """Run the four memory measurements; each part that raises becomes a row, the rest still run.

    Returns:
        Rows of check ``warm-step memory``: ``saved_activation_bytes`` (total and per module,
        plain and recompute), ``peak_live_bytes`` (per twin) and the verdict ``peak_saving_share``,
        ``lost_gradients``, ``peak_allocated_bytes`` /
        ``peak_reserved_bytes`` (CUDA) and ``estimated_saved_activation_bytes``.
    """
    rows: list[Row] = []
    measured = _guarded(rows, "saved activations", ERROR, lambda: measure_saved(setup))
    if measured is not None:
        rows += saved_rows(setup, *measured)
    on_miss = str(setup.cfg.memory.peak_on_miss)
    peaks = _guarded(rows, "step peak", on_miss if on_miss == WARN else ERROR, lambda: measure_peaks(setup))
    if peaks is not None:
        rows += peak_rows(setup, *peaks, measured[0] if measured else None)
    _guarded(rows, "gradients behind the saving", WARN, lambda: rows.extend(lost_gradient_rows(setup)))
    _guarded(rows, "CUDA allocator peaks", ERROR, lambda: rows.extend(cuda_peak_rows(setup)))
    _guarded(rows, "estimate at measured shape", WARN,
             lambda: rows.extend(estimate_rows(setup, measured[0] if measured else None, peaks[0] if peaks else None)))
    return rows


def _guarded(rows: list[Row], item: str, status: str, fn: Callable[[], Any]) -> Any:
    """Call ``fn``; an exception becomes a row of ``status`` (ERROR for a required figure, WARN
    for a cross-check such as the estimate) and the result is None."""
    start = time.perf_counter()
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - failures are data
        rows.append(Row(check=MEMORY, item=item, variant="recompute", metric="exception", status=status, seconds=time.perf_counter() - start,
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
    elif rec.total_bytes > plain.total_bytes:
        sentence = (f"{-share:+.1%}: recompute costs memory here: it keeps "
                    f"{format_bytes(rec.total_bytes - plain.total_bytes)} more for backward than the plain run "
                    f"({format_bytes(plain.total_bytes)} → {format_bytes(rec.total_bytes)}); "
                    f"{increase_cause(plain, rec, _classes(setup))}")
    else:
        why = ("recompute keeps more than the plain run" if rec.total_bytes > plain.total_bytes
               else f"recompute saves only {share:.1%} of the plain run's saved activations")
        sentence = (f"negligible saving: {why} (threshold {share_min:.0%}); recomputation is applied but buys almost "
                    "nothing, check recompute.targets")
    rows = [
        Row(check=MEMORY, item="saved activations (total)", variant=variant, metric="saved_activation_bytes", value=s.total_bytes, status=INFO,
            detail=f"{s.storages} storages kept for backward after one forward and the loss, {shape}",
            seconds=seconds[variant], role=Role.SAVED_TOTAL, unit="B", extra={"storages": s.storages})
        for variant, s in (("plain", plain), ("recompute", rec))]
    rows.append(Row(check=MEMORY, item="saving", variant="recompute", metric="saving_share", value=share, threshold=f">= {share_min:g} of plain", comparator=">=",
                    detail=sentence, role=Role.SAVING, unit="share", threshold_value=share_min, on_miss=WARN,
                    extra={"saving_bytes": plain.total_bytes - rec.total_bytes, "plain_bytes": plain.total_bytes,
                           "recompute_bytes": rec.total_bytes}))
    for order, path in enumerate(plain.per_module):
        for variant, s in (("plain", plain), ("recompute", rec)):
            what = "saved outside every wrapped module" if path == REST else f"saved while {path} runs, or its inputs"
            rows.append(Row(check=MEMORY, item=f"module {path}", variant=variant, metric="saved_activation_bytes", value=s.per_module[path], status=INFO,
                            detail=what, role=Role.SAVED_MODULE, unit="B",
                            extra={"module": path, "module_order": order, "storages": s.per_module_storages.get(path, 0),
                                   "produced_saved_bytes": s.produced_by.get(path, 0)}))
    return rows


def _classes(setup: Setup) -> dict[str, str]:
    """``{wrapped module path: class name}``."""
    return {w.path: w.cls for w in setup.wrapped}


def measure_peaks(setup: Setup) -> tuple[dict[str, StepPeak], dict[str, float]]:
    """Peak of live tensor bytes of one warm step of fresh plain and recompute twins on the
    fixed batch (:func:`reportgen.memory.peak.warm_step_peak`, ``memory.warm_steps`` steps first).

    The twins are not compiled (``torch.compile`` would hide the ops from the tracker).

    Returns:
        ``({variant: StepPeak}, {variant: seconds})``.
    """
    peaks, seconds = {}, {}
    for variant, recompute in VARIANTS:
        start = time.perf_counter()
        model = setup.build(recompute, compiled=False)
        with warnings.catch_warnings():  # torch's warnings are reported by the parity checks
            warnings.simplefilter("ignore")
            peaks[variant] = warm_step_peak(model, setup.batch, setup.task.loss, training_optimizer(setup),
                                            setup.cfg.forward_seed, max(1, int(setup.cfg.memory.warm_steps)))
        seconds[variant] = time.perf_counter() - start
        del model
    return peaks, seconds


def peak_rows(setup: Setup, peaks: dict[str, StepPeak], seconds: dict[str, float],
              saved: dict[str, SavedActivations] | None) -> list[Row]:
    """``peak_live_bytes`` per twin (INFO, with phase, module and categories at the peak) and
    the memory verdict row ``peak_saving_share``, judged ``>= memory.min_peak_saving_share``
    (``memory.peak_on_miss`` when missed), whose detail names the cause of a miss."""
    mc = setup.cfg.memory
    share_min, on_miss = float(mc.min_peak_saving_share), str(mc.peak_on_miss)
    rows = []
    for variant, peak in peaks.items():
        extra: dict[str, Any] = {
            "peak_phase": peak.phase, "peak_module": peak.module, "peak_region": peak.region or "",
            "baseline_bytes": peak.baseline_bytes, "device": peak.device, "warm_steps": int(mc.warm_steps),
            **{f"at_peak_{c.replace(' ', '_')}_bytes": peak.categories[c] for c in CATEGORIES}}
        detail = (f"peak of live tensor bytes in one warm step, reached in {where(peak)}; "
                  f"{format_bytes(peak.baseline_bytes)} were alive before the step (weights, optimizer state, batch)")
        if peak.cuda:
            allocated = peak.cuda["peak_allocated_bytes"]
            ratio = peak.peak_bytes / allocated if allocated else float("nan")
            extra |= {"cuda_peak_allocated_bytes": allocated, "cuda_peak_reserved_bytes": peak.cuda["peak_reserved_bytes"],
                      "cuda_baseline_allocated_bytes": peak.cuda["baseline_allocated_bytes"],
                      "tracker_to_allocated_ratio": ratio}
            detail += (f"; torch.cuda.max_memory_allocated in the same step: {format_bytes(allocated)} (tracker / "
                       f"allocator = {ratio:.3f}: the allocator rounds each block up and counts workspaces), "
                       f"max_memory_reserved {format_bytes(peak.cuda['peak_reserved_bytes'])}")
        rows.append(Row(check=MEMORY, item="step peak", variant=variant, metric="peak_live_bytes", value=peak.peak_bytes, status=INFO,
                        detail=detail, seconds=seconds[variant], role=Role.STEP_PEAK, unit="B", extra=extra))
    plain, rec = peaks["plain"], peaks["recompute"]
    share = saving_share(plain.peak_bytes, rec.peak_bytes)
    rows.append(Row(check=MEMORY, item="step peak saving", variant="recompute", metric="peak_saving_share", value=share,
                    threshold=f">= {share_min:g} of the plain peak", comparator=">=", detail=peak_sentence(plain, rec, share, share_min, saved, _classes(setup)),
                    role=Role.PEAK_SAVING, unit="share", threshold_value=share_min, on_miss=on_miss,
                    extra={"plain_peak_bytes": plain.peak_bytes, "recompute_peak_bytes": rec.peak_bytes,
                           "peak_saving_bytes": plain.peak_bytes - rec.peak_bytes}))
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
    return [Row(check=MEMORY, item="gradients behind the saving", variant="recompute", metric="lost_gradients", value=float(len(lost)), threshold="0", comparator="==",
                detail=detail, seconds=time.perf_counter() - start, role=Role.LOST_GRADIENTS, unit="parameters",
                threshold_value=0.0)]


def cuda_peak_rows(setup: Setup) -> list[Row]:
    """``peak_allocated_bytes`` and ``peak_reserved_bytes`` per variant on CUDA; elsewhere one
    INFO row that says they were not measured (value NaN, never 0)."""
    if setup.device.type != "cuda":
        return [Row(check=MEMORY, item="CUDA allocator peaks", variant="plain", metric="peak_allocated_bytes", value=float("nan"), status=INFO,
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
        rows.append(Row(check=MEMORY, item="CUDA step peak", variant=variant, metric="peak_allocated_bytes", value=peaks["peak_allocated_bytes"],
                        status=INFO, seconds=seconds, extra=extra, role=Role.CUDA_PEAK, unit="B",
                        detail=f"peak of tensors allocated during the step after {warm} warm step(s); "
                               f"{peaks['baseline_allocated_bytes']} B were allocated before it (weights, optimizer state)"))
        rows.append(Row(check=MEMORY, item="CUDA step peak", variant=variant, metric="peak_reserved_bytes", value=peaks["peak_reserved_bytes"],
                        status=INFO, extra=extra, role=Role.CUDA_PEAK, unit="B",
                        detail=f"peak held by the caching allocator, {gap} B above the allocated peak"))
    return rows


def estimate_rows(setup: Setup, measured: dict[str, SavedActivations] | None,
                  measured_peaks: dict[str, StepPeak] | None = None) -> list[Row]:
    """The estimator at the measured shape (must equal the measurement) and at the target shape:
    saved bytes, and the step peak (:func:`estimate_peak_rows`).

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
            rows.append(Row(check=MEMORY, item="estimate at measured shape", variant=variant, metric="estimated_saved_activation_bytes", value=est,
                            status=WARN, detail="no measurement to validate the estimator against", seconds=seconds,
                            role=Role.ESTIMATE_MEASURED, unit="B",
                            extra={"estimate_inputs": here.inputs}))
            continue
        real = measured[variant].total_bytes
        ratio = est / real if real else float("nan")
        rows.append(Row(check=MEMORY, item="estimate at measured shape", variant=variant, metric="estimated_saved_activation_bytes", value=est,
                        threshold="= measured", comparator="==", seconds=seconds, role=Role.ESTIMATE_MEASURED,
                        unit="B", threshold_value=real, on_miss=WARN,
                        detail=("estimate (fake tensors, no allocation) equals the measurement" if est == real else
                                f"estimate differs from the measurement ({est} vs {real} B): do not trust the target-shape figure"),
                        extra={"measured_bytes": real, "estimate_to_measured_ratio": ratio, "estimate_inputs": here.inputs}))
    rows += korthikanti_rows(setup, here, "measured shape")
    rows += estimate_peak_rows(here, "measured shape", seconds, measured_peaks)
    target = setup.cfg.memory.estimate
    if not target:
        return rows
    start = time.perf_counter()
    far = estimate_saved_activations(setup, target)
    seconds = time.perf_counter() - start
    overrides = ", ".join(f"{k}={v}" for k, v in _flat(far.overrides))
    share = saving_share(far.plain.total_bytes, far.recompute.total_bytes)
    for variant in ("plain", "recompute"):
        rows.append(Row(check=MEMORY, item="estimate at target shape", variant=variant, metric="estimated_saved_activation_bytes",
                        value=getattr(far, variant).total_bytes, status=INFO, seconds=seconds, role=Role.ESTIMATE_TARGET, unit="B",
                        detail=f"inputs {far.inputs}, {far.dtype}; overrides: {overrides}",
                        extra={"estimate_inputs": far.inputs, "estimate_overrides": overrides, "saving_share": share}))
    return rows + korthikanti_rows(setup, far, "target shape") + estimate_peak_rows(far, "target shape", seconds)


#: Largest relative difference of the estimated from the measured step peak at the measured
#: shape (issue 15: "within 1 %"); both count the same tensors, so they agree exactly in practice.
PEAK_ESTIMATE_TOLERANCE = 0.01


def estimate_peak_rows(estimate: Estimate, where_: str, seconds: float,
                       measured_peaks: dict[str, StepPeak] | None = None) -> list[Row]:
    """``estimated_peak_live_bytes`` of both fake twins at one shape (INFO, with phase, module and
    categories), and at the measured shape ``estimated_peak_rel_diff`` per twin, judged
    ``<= PEAK_ESTIMATE_TOLERANCE`` (WARN when missed: do not trust the target-shape peak)."""
    if estimate.plain_peak is None or estimate.recompute_peak is None:
        return [Row(check=MEMORY, item=f"step peak estimate, {where_}", variant="recompute", metric="estimated_peak_live_bytes", status=WARN,
                    role=Role.ESTIMATE_PEAK, unit="B", seconds=seconds,
                    detail=f"the step peak could not be estimated on fake tensors ({estimate.peak_error})")]
    rows = []
    for variant in ("plain", "recompute"):
        peak: StepPeak = getattr(estimate, f"{variant}_peak")
        extra: dict[str, Any] = {"estimate_inputs": estimate.inputs, "estimate_shape": where_, "peak_phase": peak.phase,
                                 "peak_module": peak.module, "peak_region": peak.region or "",
                                 **{f"at_peak_{c.replace(' ', '_')}_bytes": peak.categories[c] for c in CATEGORIES}}
        rows.append(Row(check=MEMORY, item=f"step peak estimate, {where_}", variant=variant, metric="estimated_peak_live_bytes", value=peak.peak_bytes,
                        status=INFO, seconds=seconds, role=Role.ESTIMATE_PEAK, unit="B", extra=extra,
                        detail=f"fake tensors, inputs {estimate.inputs}, {estimate.dtype}: reached in {where(peak)}; "
                               "allocator fragmentation and caching, communication buffers and CUDA workspaces are "
                               "not tensors and not counted"))
        if measured_peaks is not None and variant in measured_peaks:
            real = measured_peaks[variant].peak_bytes
            diff = abs(peak.peak_bytes - real) / real if real else float("nan")
            rows.append(Row(check=MEMORY, item=f"step peak estimate, {where_}", variant=variant, metric="estimated_peak_rel_diff", value=diff,
                            threshold=f"<= {PEAK_ESTIMATE_TOLERANCE:g} of measured", comparator="<=", role=Role.ESTIMATE_PEAK, unit="share",
                            threshold_value=PEAK_ESTIMATE_TOLERANCE, on_miss=WARN,
                            detail=(f"estimated step peak {format_bytes(peak.peak_bytes)}, measured {format_bytes(real)}"
                                    + ("" if diff <= PEAK_ESTIMATE_TOLERANCE else
                                       ": do not trust the target-shape peak")),
                            extra={"estimate_shape": where_, "estimated_peak_bytes": peak.peak_bytes,
                                   "measured_peak_bytes": real}))
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
    symbols = {"seq_s": shape.s, "batch_b": shape.b, "width_h": shape.h, "heads_a": shape.a, "element_bytes": e, "mask_bytes": m,
               "layernorms": norms}
    plain = estimate.per_layer("plain")
    formula = shape.formula_bytes(e, m)
    rows = [Row(check=MEMORY, item=f"per layer, {where}", variant="plain", metric="estimated_saved_activation_bytes", value=plain, status=INFO,
                role=Role.PER_LAYER, unit="B",
                detail="median over wrapped modules; Korthikanti et al. 2022 eq. (1) beside it",
                extra={**symbols, "korthikanti_16bit_bytes": shape.formula_bytes(2), "formula_bytes": formula,
                       "layernorm_stats_bytes": ln_stats, "residual_bytes": plain - formula - ln_stats,
                       "formula_ratio": plain / formula})]
    rec = estimate.per_layer("recompute")
    full = shape.full_recompute_bytes(e)
    rows.append(Row(check=MEMORY, item=f"per layer, {where}", variant="recompute", metric="estimated_saved_activation_bytes", value=rec, status=INFO,
                    role=Role.PER_LAYER, unit="B",
                    detail="median over wrapped modules; full recomputation keeps the layer input only (2sbh in 16-bit)",
                    extra={**symbols, "korthikanti_16bit_bytes": shape.full_recompute_bytes(2), "formula_bytes": full,
                           "layernorm_stats_bytes": 0, "residual_bytes": rec - full, "formula_ratio": rec / full}))
    return rows


CHECK = Check(warm_step_memory, (Section(
    MEMORY, "What recomputation saves, and whether the saving is real: the peak of live tensor bytes of a training step "
    "(the verdict, any device), bytes autograd keeps for backward (exact on any device, per wrapped module), CUDA "
    "allocator peaks where there is CUDA, and a GPU-free estimate at the target shape.",
    template="sections/warm-step-memory.html.j2", plotter=memory_plots),), config="memory")
