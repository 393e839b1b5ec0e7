"""The figure behind a ``fits: batch B [at seq S] within M GiB`` clause: the recompute twin's
step peak predicted at that shape.

Method (stated in the clause row): the GPU-free estimate (:func:`reportgen.estimate.estimate_saved_activations`,
the same ``MemTracker`` counter on ``FakeTensorMode`` tensors) gives the recompute twin's step
peak at the target shape; it is scaled by measured ÷ estimated step peak at the measured shape
(the memory check's ``estimated_peak_rel_diff`` row shows they agree), and on CUDA by the
allocator's ``max_memory_allocated`` ÷ tracked bytes of the measured step (block rounding and
workspaces are not tensors). Where the estimator cannot run and no sequence is given, the peak
is scaled linearly in examples: the parts alive at the peak that do not depend on the batch
(parameters, buffers, gradients, optimizer state) stay, the rest grows by ``B / measured batch``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd

from reportgen.claim.clauses import FITS, Claim, Clause
from reportgen.config import MEMORY
from reportgen.memory.estimate import estimate_saved_activations
from reportgen.results import Role
from reportgen.results.row import to_float

#: Categories alive at the peak that do not grow with the batch (reportgen.memory.step_peak.CATEGORIES).
FIXED = ("parameters", "buffers", "gradients", "optimizer_state")


def measure_fits(setup: Any, claim: Claim | None, frame: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """``{clause text: figures}`` for every ``fits`` clause of ``claim`` (empty without one).

    Each figures dict holds ``predicted_bytes``, ``method`` (a sentence), ``measured_batch``,
    ``measured_peak_bytes`` and the scale factors; or ``error`` when no prediction could be made
    (the clause then says *cannot tell*). Never raises.
    """
    out: dict[str, dict[str, Any]] = {}
    for clause in (c for c in (claim.clauses if claim else ()) if c.kind == FITS):
        try:
            out[clause.text] = predict_peak(setup, clause, frame)
        except Exception as exc:  # noqa: BLE001 - a clause that cannot be estimated cannot be told
            out[clause.text] = {
                "error": f"the step peak at batch {clause.batch} could not be predicted ({type(exc).__name__}: {exc})"
            }
    return out


def _recompute_row(frame: pd.DataFrame, role: str, **match: str) -> pd.Series | None:
    hit = frame[(frame.check == MEMORY) & (frame.role == role) & (frame.variant == "recompute")]
    for column, value in match.items():
        hit = hit[hit.get(column) == value] if column in hit.columns else hit.iloc[0:0]
    return hit.iloc[0] if len(hit) else None


def predict_peak(setup: Any, clause: Clause, frame: pd.DataFrame) -> dict[str, Any]:
    """The recompute twin's step peak at ``clause.batch`` (and ``clause.seq``), B, with how it was made.

    Raises:
        ValueError: the memory check measured no step peak, or neither method applies.
    """
    measured = _recompute_row(frame, Role.STEP_PEAK)
    if measured is None or not math.isfinite(float(measured.value)):
        raise ValueError("the memory check measured no step peak of the recompute twin")
    batch0 = int(setup.config.parity.batch_size)
    figures: dict[str, Any] = {"measured_batch": batch0, "measured_peak_bytes": float(measured.value)}
    figures |= {"target_batch": clause.batch, "target_seq": clause.seq}
    allocated = to_float(measured.get("cuda_peak_allocated_bytes"))  # CUDA only: allocator peak ÷ tracked peak
    allocator = allocated / float(measured.value) if math.isfinite(allocated) and float(measured.value) else math.nan
    try:
        figures |= _by_estimate(setup, clause, frame, float(measured.value))
    except Exception as exc:  # noqa: BLE001 - fall back to the linear slope where it applies
        if clause.seq is not None:
            raise ValueError(
                f"the estimator could not run at seq {clause.seq} ({type(exc).__name__}: {exc}); "
                "a sequence length needs it (attention grows with its square)"
            ) from None
        figures |= _by_slope(measured, batch0, int(clause.batch or batch0), f"{type(exc).__name__}: {exc}")
    figures["allocator_ratio"] = allocator
    if math.isfinite(allocator):
        figures["predicted_bytes"] *= allocator
        figures["method"] += (
            f"; × {allocator:.3f}, torch.cuda.max_memory_allocated ÷ tracked bytes of the measured "
            "step (allocator rounding and workspaces)"
        )
    return figures


def _by_estimate(setup: Any, clause: Clause, frame: pd.DataFrame, measured_bytes: float) -> dict[str, Any]:
    """Estimated peak at the target shape × (measured ÷ estimated at the measured shape)."""
    here = _recompute_row(
        frame, Role.ESTIMATE_PEAK, metric="estimated_peak_live_bytes", estimate_shape="measured shape"
    )
    if here is None or not math.isfinite(float(here.value)) or float(here.value) <= 0:
        raise ValueError("no step-peak estimate at the measured shape to scale by")
    overrides: dict[str, Any] = {"batch_size": clause.batch}
    if clause.seq is not None:
        overrides["task"] = {str(setup.config.claim.seq_key): clause.seq}
    target = estimate_saved_activations(setup, overrides)
    if target.recompute_peak is None:
        raise ValueError(target.peak_error or "the estimator counted no step peak")
    drawn = re.match(r"\[(\d+)", target.inputs)
    if drawn is None or int(drawn.group(1)) != clause.batch:  # e.g. a task that caps a batch at its data size
        raise ValueError(f"the task drew a batch of inputs {target.inputs}, not {clause.batch} examples")
    scale = measured_bytes / float(here.value)
    shape = f"batch {clause.batch}" + (f", {setup.config.claim.seq_key}={clause.seq}" if clause.seq else "")
    return {
        "predicted_bytes": target.recompute_peak.peak_bytes * scale,
        "estimated_target_peak_bytes": target.recompute_peak.peak_bytes,
        "estimate_scale": scale,
        "estimate_inputs": target.inputs,
        "method": (
            f"GPU-free estimate of the recompute twin's step peak at {shape} (inputs {target.inputs}, "
            f"fake tensors) × {scale:.4f}, measured ÷ estimated peak at the measured batch "
            f"{setup.config.parity.batch_size}"
        ),
    }


def _by_slope(measured: pd.Series, batch0: int, batch: int, why: str) -> dict[str, Any]:
    """Peak parts that grow with the batch scaled by ``batch / batch0``; the rest kept."""
    fixed = sum(float(measured.get(f"at_peak_{c}_bytes", 0.0) or 0.0) for c in FIXED)
    growing = float(measured.value) - fixed
    return {
        "predicted_bytes": fixed + growing * batch / batch0,
        "fixed_bytes": fixed,
        "growing_bytes": growing,
        "method": (
            f"measured step peak at batch {batch0} with its batch-dependent part "
            f"(activations, temporaries, batch: {growing:.4g} B) scaled by {batch}/{batch0} and the rest "
            f"(parameters, gradients, optimizer state: {fixed:.4g} B) kept; the estimator could not run ({why})"
        ),
    }
