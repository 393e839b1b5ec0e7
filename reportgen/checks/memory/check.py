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
from collections.abc import Callable, Sequence
from typing import Any

from reportgen.checks.base import Check, Section
from reportgen.checks.base.run import Run
from reportgen.checks.memory.estimate import estimate_rows
from reportgen.checks.memory.plots import memory_plots
from reportgen.checks.memory.rows import bytes_row, peak_rows, saved_rows
from reportgen.config import MEMORY, MemoryConfig
from reportgen.memory.device_peak import PhasePeak, run_device_peak, run_host_peak
from reportgen.memory.peak import warm_step_peak
from reportgen.memory.saved import SavedActivations, cuda_step_peaks, saved_activation_bytes
from reportgen.memory.step_peak import StepPeak, format_bytes
from reportgen.results import Role, Row, Status
from reportgen.results.compared import zero_count_row
from reportgen.results.raised import exception_message, raised_in, raised_status, twin_column
from reportgen.twins.forward import forward_backward
from reportgen.twins.setup import Setup

VARIANTS = (("plain", False), ("recompute", True))


def warm_step_memory(run: Run) -> list[Row]:
    """Run the four memory measurements; each part that raises becomes a row, the rest still run.

    Returns:
        Rows of check ``warm-step memory``: ``saved_activation_bytes`` (total and per module,
        plain and recompute), ``peak_live_bytes`` (per twin) and the verdict ``peak_saving_share``,
        ``lost_gradients``, ``peak_allocated_bytes`` /
        ``peak_reserved_bytes`` (CUDA) and ``estimated_saved_activation_bytes``.
    """
    setup = run.setup
    rows: list[Row] = []
    measured = _guarded(rows, "saved activations", Status.ERROR, lambda: measure_saved(setup))
    if measured is not None:
        rows += saved_rows(setup, *measured)
    section: MemoryConfig = setup.config.memory
    on_miss = section.peak_on_miss
    cuda_rows: list[Row] = []  # each twin's allocator peaks, measured once, alone on the device
    cuda = _guarded(cuda_rows, "CUDA allocator peaks", Status.ERROR, lambda: cuda_peaks(setup))
    peaks = _guarded(
        rows, "step peak", on_miss if on_miss == Status.WARN else Status.ERROR, lambda: measure_peaks(setup)
    )
    if peaks is not None:
        by_twin, seconds = peaks
        for variant, peak in by_twin.items():  # the step-peak row states the same allocator figures
            peak.cuda = {k: v for k, v in (cuda or {}).get(variant, {}).items() if k != "seconds"} or None
        rows += peak_rows(setup, by_twin, seconds, measured[0] if measured else None)
    _guarded(rows, "gradients behind the saving", Status.WARN, lambda: rows.extend(lost_gradient_rows(setup)))
    rows += cuda_rows if cuda is None else cuda_peak_rows(setup, cuda)
    _guarded(
        rows,
        "estimate at measured shape",
        Status.WARN,
        lambda: rows.extend(estimate_rows(setup, measured[0] if measured else None, peaks[0] if peaks else None)),
    )
    return rows


def _guarded(rows: list[Row], item: str, status: str, fn: Callable[[], Any]) -> Any:
    """Call ``fn``; an exception becomes a row of ``status`` (ERROR for a required figure, WARN
    for a cross-check such as the estimate) and the result is None."""
    start = time.perf_counter()
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - failures are data
        twin = getattr(exc, "reportgen_twin", None)  # set by raised_in: which twin raised
        said = f"the {twin} twin raised " if twin else ""
        detail = f"not measured: {said}{type(exc).__name__}: {exception_message(exc)}"
        status = raised_status(exc, status)
        row = Row.fact(
            MEMORY, item, Role.EXCEPTION, detail, status=status, variant=twin or "recompute", extra=twin_column(twin)
        )
        row.seconds = time.perf_counter() - start
        rows.append(row)
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
        with raised_in(variant):
            model = setup.build(recompute)
            saved[variant] = saved_activation_bytes(
                model, setup.batch, setup.training_step, setup.config.forward_seed, paths
            )
        seconds[variant] = time.perf_counter() - start
        del model
    return saved, seconds


def measure_peaks(setup: Setup) -> tuple[dict[str, StepPeak], dict[str, float]]:
    """Peak of live tensor bytes of one warm step of fresh plain and recompute twins on the
    fixed batch (:func:`reportgen.memory.peak.warm_step_peak`, ``memory.warm_steps`` steps first).

    The twins are not compiled (``torch.compile`` would hide the ops from the tracker).

    Returns:
        ``({variant: StepPeak}, {variant: seconds})``.
    """
    section: MemoryConfig = setup.config.memory
    peaks, seconds = {}, {}
    for variant, recompute in VARIANTS:
        start = time.perf_counter()
        step = setup.train_step(recompute, compiled=False)
        with warnings.catch_warnings(), raised_in(variant):  # torch's warnings are reported by the parity checks
            warnings.simplefilter("ignore")
            peaks[variant] = warm_step_peak(step, max(1, section.warm_steps))
        seconds[variant] = time.perf_counter() - start
        del step
    return peaks, seconds


def lost_gradient_rows(setup: Setup) -> list[Row]:
    """FAIL when a trainable parameter has a gradient in the plain run and None under recompute:
    that saving comes from activations that are never needed because gradients were lost."""
    start = time.perf_counter()
    # the twin is discarded: no second copy of its gradients
    run = lambda r: forward_backward(setup.twin(r), setup.batch, setup.config.forward_seed, clone_grads=False)
    with warnings.catch_warnings():  # torch's warnings are reported by gradient parity, not repeated here
        warnings.simplefilter("ignore")
        plain, rec = run(False), run(True)  # one twin resident at a time
    lost = sorted(n for n, g in plain.grads.items() if g is not None and rec.grads.get(n) is None)
    if lost:
        names = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
        detail = (
            f"the saving is not real: {len(lost)} parameter(s) get a gradient in the plain run and none under "
            f"recompute ({names}); their activations are not kept because they are never used"
        )
    else:
        detail = "every parameter with a gradient in the plain run has one under recompute"
    seconds = time.perf_counter() - start
    item = "gradients behind the saving"
    return [
        zero_count_row(
            MEMORY, item, "lost_gradients", len(lost), "parameters", Role.LOST_GRADIENTS, detail, seconds=seconds
        )
    ]


def cuda_peaks(setup: Setup) -> dict[str, dict[str, float]]:
    """``{variant: allocator peaks}`` of one warm step of each twin on CUDA
    (:func:`reportgen.memory.saved.cuda_step_peaks`: only that twin, its optimizer state and the batch
    are resident; the one build the twins copy stays on the host), with ``seconds`` each; {} elsewhere.
    The one measurement every row that states a twin's CUDA peak reads."""
    if setup.device.type != "cuda":
        return {}
    out = {}
    for variant, recompute in VARIANTS:
        start = time.perf_counter()
        with raised_in(variant):
            peaks = cuda_step_peaks(setup, recompute, setup.config.memory.warm_steps)
        out[variant] = {**peaks, "seconds": time.perf_counter() - start}
    return out


def cuda_peak_rows(setup: Setup, cuda: dict[str, dict[str, float]]) -> list[Row]:
    """``peak_allocated_bytes`` and ``peak_reserved_bytes`` per variant from :func:`cuda_peaks` on CUDA;
    elsewhere one INFO row that says they were not measured (value NaN, never 0)."""
    if setup.device.type != "cuda":
        detail = (
            f"not measured: this run is on {setup.device.type}, and allocator peaks exist only on CUDA. "
            "The saved-activation bytes above are exact on every device."
        )
        return [
            Row.fact(MEMORY, "CUDA allocator peaks", Role.NOTE, detail, metric="peak_allocated_bytes", variant="plain")
        ]
    section: MemoryConfig = setup.config.memory
    warm = section.warm_steps
    item, rows = "CUDA step peak", []
    for variant, _ in VARIANTS:
        peaks = cuda[variant]
        before, gap = peaks["baseline_allocated_bytes"], peaks["peak_reserved_bytes"] - peaks["peak_allocated_bytes"]
        extra = {"baseline_allocated_bytes": before, "reserved_gap_bytes": gap, "warm_steps": warm}
        allocated = (
            f"peak of tensors allocated during the step after {warm} warm step(s); "
            f"{before} B were allocated before it (weights, optimizer state)"
        )
        reserved = f"peak held by the caching allocator, {gap} B above the allocated peak"
        for metric, detail, seconds in (
            ("peak_allocated_bytes", allocated, peaks["seconds"]),
            ("peak_reserved_bytes", reserved, 0.0),
        ):
            rows.append(bytes_row(item, Role.CUDA_PEAK, detail, variant, peaks[metric], seconds, extra, metric=metric))
    return rows


def run_peak_rows(setup: Setup, phases: Sequence[PhasePeak] = ()) -> list[Row]:
    """The whole run's own peak (every twin of every check), an INFO row of this check made after the last check:
    on CUDA ``max_memory_allocated`` / ``max_memory_reserved`` over the run
    (:func:`reportgen.memory.device_peak.run_device_peak`), elsewhere the peak resident set; it names the phase (the
    check) that reached it. Beside it, the bytes of the one build every twin copies, so a reader sees what the
    harness holds beyond one twin; then one INFO row per phase, its own peak (``phases``, measured by the pipeline
    with :func:`reportgen.memory.device_peak.phase_peak`).
    """
    build = setup.template.nbytes
    cuda = run_device_peak(setup.device) if setup.device.type == "cuda" else None
    if cuda is not None:
        metric, value = "run_peak_allocated_bytes", cuda[0]
        said = f"max_memory_allocated {format_bytes(cuda[0])}, max_memory_reserved {format_bytes(cuda[1])} on {setup.device}"
        extra: dict[str, Any] = {"run_peak_reserved_bytes": cuda[1]}
    else:
        metric, value = "run_peak_rss_bytes", run_host_peak()
        said = (
            f"peak resident set of the process {format_bytes(value)} (host memory: this run is on {setup.device.type})"
        )
        extra = {}
    top = max(phases, key=lambda p: p.bytes, default=None)
    reached = f", reached in {top.phase} ({format_bytes(top.bytes)})" if top is not None else ""
    detail = (
        f"the whole run's own peak, every twin of every check: {said}{reached}; the one build every twin is "
        f"copied from holds {format_bytes(build)} (on the host); one twin's step peak is measured alone, above"
    )
    extra |= {"build_bytes": build, "phase": top.phase if top is not None else None}
    rows = [bytes_row("run peak", Role.NOTE, detail, "plain", float(value), extra=extra, metric=metric)]
    for p in phases:
        bound = "" if p.exact else " (an upper bound: this kernel cannot reset the high-water mark)"
        said = (
            f"peak during {p.phase}{bound}, {format_bytes(p.resident_before)} resident when it began; "
            "a peak far above the one before is what this phase holds beyond the run's twins"
        )
        extra = {"phase": p.phase, "resident_before_bytes": p.resident_before, "exact": p.exact}
        rows.append(
            bytes_row(f"peak during {p.phase}", Role.NOTE, said, "plain", float(p.bytes), extra=extra, metric=p.metric)
        )
    return rows


CHECK = Check(
    warm_step_memory,
    (
        Section(
            MEMORY,
            "What recomputation saves, and whether the saving is real: the peak of live tensor bytes of a training step "
            "(the verdict, any device), bytes autograd keeps for backward (exact on any device, per wrapped module), CUDA "
            "allocator peaks where there is CUDA, and a GPU-free estimate at the target shape.",
            template="sections/warm-step-memory.html.j2",
            plotter=memory_plots,
            roles=(
                Role.SAVED_TOTAL,
                Role.SAVING,
                Role.SAVED_MODULE,
                Role.STEP_PEAK,
                Role.PEAK_SAVING,
                Role.CUDA_PEAK,
                Role.ESTIMATE_PEAK,
                Role.ESTIMATE_MEASURED,
                Role.ESTIMATE_TARGET,
                Role.PER_LAYER,
                Role.LOST_GRADIENTS,
                Role.NOTE,
            ),
        ),
    ),
    config="memory",
)
