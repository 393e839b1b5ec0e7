"""The rows of the warm-step memory check's two main measurements (:mod:`reportgen.checks.memory.check`):
saved-activation bytes (total, per wrapped module, and the ``saving_share`` row) and the step peak
(``peak_live_bytes`` per twin, and the verdict row ``peak_saving_share``).
"""

from __future__ import annotations

import math
from typing import Any

from reportgen.config import MEMORY, MemoryConfig
from reportgen.memory.saved import REST, SavedActivations
from reportgen.memory.step_peak import CATEGORIES, StepPeak, format_bytes, increase_cause, peak_sentence, where
from reportgen.results import Role, Row, Status
from reportgen.structure import describe
from reportgen.twins.setup import Setup


def saving_share(plain_bytes: int, recompute_bytes: int) -> float:
    """Share of the plain run's saved-activation bytes that recomputation saves:
    ``(plain - recompute) / plain`` (0 when plain saves nothing; negative when recompute keeps more)."""
    return (plain_bytes - recompute_bytes) / plain_bytes if plain_bytes else 0.0


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
        sentence = (
            f"negligible saving: recompute saves only {share:.1%} of the plain run's saved activations (threshold "
            f"{share_min:.0%}); recomputation is applied but buys almost nothing, check recompute.targets"
        )
    rows = []
    after = (
        "by the forwards of your forward_backward, summed"
        if not setup.training_step.sees_outputs
        else "after one forward and the loss"
    )
    for variant, s in (("plain", plain), ("recompute", rec)):
        what = f"{s.storages} storages kept for backward {after}, {shape}"
        took, extra = seconds[variant], {"storages": s.storages}
        rows.append(bytes_row("saved activations (total)", Role.SAVED_TOTAL, what, variant, s.total_bytes, took, extra))
    saving = {"saving_bytes": plain.total_bytes - rec.total_bytes, "plain_bytes": plain.total_bytes}
    saving["recompute_bytes"] = rec.total_bytes
    rows.append(_saving_row("saving", Role.SAVING, share, share_min, "plain", Status.WARN, sentence, saving))
    for order, path in enumerate(plain.per_module):
        what = "saved outside every wrapped module" if path == REST else f"saved while {path} runs, or its inputs"
        for variant, s in (("plain", plain), ("recompute", rec)):
            module: dict[str, Any] = {"module": path, "module_order": order}
            module |= {
                "storages": s.per_module_storages.get(path, 0),
                "produced_saved_bytes": s.produced_by.get(path, 0),
            }
            rows.append(bytes_row(f"module {path}", Role.SAVED_MODULE, what, variant, s.per_module[path], extra=module))
    return rows


def bytes_row(
    item: str,
    role: str,
    detail: str,
    variant: str = "recompute",
    value: float = math.nan,
    seconds: float = 0.0,
    extra: dict | None = None,
    *,
    metric: str = "saved_activation_bytes",
    status: str = Status.INFO,
) -> Row:
    """A fact of the warm-step memory check in bytes (B): one twin's ``saved_activation_bytes`` (in total or of
    one module), or another ``metric`` (a step peak, a CUDA or run peak, an estimate); value NaN when there is none."""
    return Row.fact(
        MEMORY,
        item,
        role,
        detail,
        status=status,
        metric=metric,
        value=value,
        unit="B",
        variant=variant,
        seconds=seconds,
        extra=extra,
    )


def _saving_row(
    item: str, role: str, share: float, least: float, of: str, on_miss: str, detail: str, extra: dict[str, Any]
) -> Row:
    """A saving (role ``saving`` or ``peak_saving``, metric ``<role>_share``): ``share`` of the plain twin's bytes
    (``of``: "plain", "the plain peak") that recompute saves, judged ``>= least`` (``on_miss`` when below)."""
    return Row.measured(
        MEMORY,
        item,
        f"{role}_share",
        share,
        "share",
        comparator=">=",
        threshold_value=least,
        threshold=f">= {least:g} of {of}",
        on_miss=on_miss,
        role=role,
        detail=detail,
        extra=extra,
    )


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
        took = seconds[variant]
        rows.append(
            bytes_row(
                "step peak", Role.STEP_PEAK, detail, variant, peak.peak_bytes, took, extra, metric="peak_live_bytes"
            )
        )
    plain, rec = peaks["plain"], peaks["recompute"]
    share = saving_share(plain.peak_bytes, rec.peak_bytes)
    sentence = peak_sentence(plain, rec, share, share_min, saved, _classes(setup))
    saving = {"plain_peak_bytes": plain.peak_bytes, "recompute_peak_bytes": rec.peak_bytes}
    saving["peak_saving_bytes"] = plain.peak_bytes - rec.peak_bytes
    rows.append(
        _saving_row("step peak saving", Role.PEAK_SAVING, share, share_min, "the plain peak", on_miss, sentence, saving)
    )
    return rows
