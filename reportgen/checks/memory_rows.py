"""The rows of the warm-step memory check's two main measurements (:mod:`reportgen.checks.memory`):
saved-activation bytes (total, per wrapped module, and the ``saving_share`` row) and the step peak
(``peak_live_bytes`` per twin, and the verdict row ``peak_saving_share``).
"""

from __future__ import annotations

from typing import Any

from reportgen.checks.memory_estimate import saving_share
from reportgen.config import MEMORY, MemoryConfig
from reportgen.memory.peak import CATEGORIES, StepPeak, format_bytes, increase_cause, peak_sentence, where
from reportgen.memory.saved import REST, SavedActivations
from reportgen.results import Role, Row, Status
from reportgen.structure import describe
from reportgen.twins.setup import Setup


def saved_rows(setup: Setup, saved: dict[str, SavedActivations], seconds: dict[str, float]) -> list[Row]:
    """Total and per-module ``saved_activation_bytes`` rows (INFO), and the ``saving_share`` row,
    judged ``>= memory.negligible_saving_share`` (WARN when below: the saving is negligible)."""
    section: MemoryConfig = setup.config.memory
    share_min = section.negligible_saving_share
    plain, rec = saved["plain"], saved["recompute"]
    share = saving_share(plain.total_bytes, rec.total_bytes)
    shape = f"batch {describe(setup.batch[0])}"
    if share >= share_min:
        sentence = f"recompute keeps {1 - share:.1%} of the plain run's saved activations (saves {share:.1%})"
    elif rec.total_bytes > plain.total_bytes:
        sentence = (
            f"{-share:+.1%}: recompute costs memory here: it keeps "
            f"{format_bytes(rec.total_bytes - plain.total_bytes)} more for backward than the plain run "
            f"({format_bytes(plain.total_bytes)} → {format_bytes(rec.total_bytes)}); "
            f"{increase_cause(plain, rec, _classes(setup))}"
        )
    else:
        why = (
            "recompute keeps more than the plain run"
            if rec.total_bytes > plain.total_bytes
            else f"recompute saves only {share:.1%} of the plain run's saved activations"
        )
        sentence = (
            f"negligible saving: {why} (threshold {share_min:.0%}); recomputation is applied but buys almost "
            "nothing, check recompute.targets"
        )
    rows = [
        Row(
            check=MEMORY,
            item="saved activations (total)",
            variant=variant,
            metric="saved_activation_bytes",
            value=s.total_bytes,
            status=Status.INFO,
            detail=f"{s.storages} storages kept for backward after one forward and the loss, {shape}",
            seconds=seconds[variant],
            role=Role.SAVED_TOTAL,
            unit="B",
            extra={"storages": s.storages},
        )
        for variant, s in (("plain", plain), ("recompute", rec))
    ]
    rows.append(
        Row(
            check=MEMORY,
            item="saving",
            variant="recompute",
            metric="saving_share",
            value=share,
            threshold=f">= {share_min:g} of plain",
            comparator=">=",
            detail=sentence,
            role=Role.SAVING,
            unit="share",
            threshold_value=share_min,
            on_miss=Status.WARN,
            extra={
                "saving_bytes": plain.total_bytes - rec.total_bytes,
                "plain_bytes": plain.total_bytes,
                "recompute_bytes": rec.total_bytes,
            },
        )
    )
    for order, path in enumerate(plain.per_module):
        for variant, s in (("plain", plain), ("recompute", rec)):
            what = "saved outside every wrapped module" if path == REST else f"saved while {path} runs, or its inputs"
            rows.append(
                Row(
                    check=MEMORY,
                    item=f"module {path}",
                    variant=variant,
                    metric="saved_activation_bytes",
                    value=s.per_module[path],
                    status=Status.INFO,
                    detail=what,
                    role=Role.SAVED_MODULE,
                    unit="B",
                    extra={
                        "module": path,
                        "module_order": order,
                        "storages": s.per_module_storages.get(path, 0),
                        "produced_saved_bytes": s.produced_by.get(path, 0),
                    },
                )
            )
    return rows


def _classes(setup: Setup) -> dict[str, str]:
    """``{wrapped module path: class name}``."""
    return {w.path: w.cls for w in setup.wrapped}


def peak_rows(
    setup: Setup, peaks: dict[str, StepPeak], seconds: dict[str, float], saved: dict[str, SavedActivations] | None
) -> list[Row]:
    """``peak_live_bytes`` per twin (INFO, with phase, module and categories at the peak) and
    the memory verdict row ``peak_saving_share``, judged ``>= memory.min_peak_saving_share``
    (``memory.peak_on_miss`` when missed), whose detail names the cause of a miss."""
    mc: MemoryConfig = setup.config.memory
    share_min, on_miss = mc.min_peak_saving_share, mc.peak_on_miss
    rows = []
    for variant, peak in peaks.items():
        extra: dict[str, Any] = {
            "peak_phase": peak.phase,
            "peak_module": peak.module,
            "peak_region": peak.region or "",
            "baseline_bytes": peak.baseline_bytes,
            "device": peak.device,
            "warm_steps": mc.warm_steps,
            **{f"at_peak_{c.replace(' ', '_')}_bytes": peak.categories[c] for c in CATEGORIES},
        }
        detail = (
            f"peak of live tensor bytes in one warm step, reached in {where(peak)}; "
            f"{format_bytes(peak.baseline_bytes)} were alive before the step (weights, optimizer state, batch)"
        )
        if peak.cuda:
            allocated = peak.cuda["peak_allocated_bytes"]
            ratio = peak.peak_bytes / allocated if allocated else float("nan")
            extra |= {
                "cuda_peak_allocated_bytes": allocated,
                "cuda_peak_reserved_bytes": peak.cuda["peak_reserved_bytes"],
                "cuda_baseline_allocated_bytes": peak.cuda["baseline_allocated_bytes"],
                "tracker_to_allocated_ratio": ratio,
            }
            detail += (
                f"; torch.cuda.max_memory_allocated in the same step: {format_bytes(allocated)} (tracker / "
                f"allocator = {ratio:.3f}: the allocator rounds each block up and counts workspaces), "
                f"max_memory_reserved {format_bytes(peak.cuda['peak_reserved_bytes'])}"
            )
        rows.append(
            Row(
                check=MEMORY,
                item="step peak",
                variant=variant,
                metric="peak_live_bytes",
                value=peak.peak_bytes,
                status=Status.INFO,
                detail=detail,
                seconds=seconds[variant],
                role=Role.STEP_PEAK,
                unit="B",
                extra=extra,
            )
        )
    plain, rec = peaks["plain"], peaks["recompute"]
    share = saving_share(plain.peak_bytes, rec.peak_bytes)
    rows.append(
        Row(
            check=MEMORY,
            item="step peak saving",
            variant="recompute",
            metric="peak_saving_share",
            value=share,
            threshold=f">= {share_min:g} of the plain peak",
            comparator=">=",
            detail=peak_sentence(plain, rec, share, share_min, saved, _classes(setup)),
            role=Role.PEAK_SAVING,
            unit="share",
            threshold_value=share_min,
            on_miss=on_miss,
            extra={
                "plain_peak_bytes": plain.peak_bytes,
                "recompute_peak_bytes": rec.peak_bytes,
                "peak_saving_bytes": plain.peak_bytes - rec.peak_bytes,
            },
        )
    )
    return rows
