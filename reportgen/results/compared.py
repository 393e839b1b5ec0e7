"""Rows comparing one tensor or one plain value between the twins (plain vs recompute), with the A/A
control's distance beside it."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from reportgen.results.distance import measure, tolerances
from reportgen.results.row import Row

#: Marker for "the A/A twin was not run" (``aa`` arguments default to it).
NO_AA = object()


def _both_values(plain: Tensor, recompute: Tensor) -> dict[str, Any]:
    """Both twins' values for the report: the numbers of a real scalar, else the L2 norms (of both parts of a
    complex tensor)."""
    if plain.numel() == 1 and recompute.numel() == 1 and not plain.is_complex():
        return {"plain_value": float(plain.double()), "recompute_value": float(recompute.double())}
    if not (plain.is_floating_point() or plain.is_complex()):  # e.g. a generator state: how much of it differs
        differ = int((plain.to(recompute.device) != recompute).sum())
        return {
            "plain_value": f"{plain.numel()} values",
            "recompute_value": f"{differ} of them differ",
            "values_compared": plain.numel(),
            "values_differing": differ,
        }
    norm = lambda t: float(torch.linalg.vector_norm(t.detach().cdouble() if t.is_complex() else t.detach().double()))
    return {"plain_norm": norm(plain), "recompute_norm": norm(recompute)}


def _aa_extra(plain: Tensor | None, aa: Any, rt: float, at: float) -> dict[str, Any]:
    """A/A columns: how far a second, independent plain twin is from the plain twin."""
    if aa is NO_AA:
        return {}
    if plain is None or aa is None:
        both = 0.0 if plain is None and aa is None else float("inf")
        return dict.fromkeys(("aa_max_abs_err", "aa_excess", "aa_tolerance_used"), both)
    d = measure(aa, plain, rt, at)
    return {"aa_max_abs_err": d.max_abs_err, "aa_excess": d.worst_excess, "aa_tolerance_used": d.tolerance_used}


def tolerance_used(row: Row, prefix: str = "") -> float:
    """The share of its tolerance a compared item uses (``tolerance_used``, or ``aa_tolerance_used``
    with ``prefix="aa_"``); rows without that column (plain values, generator states) count 0 when
    within (``excess <= 0``) and inf when not."""
    used = row.extra.get(f"{prefix}tolerance_used")
    if used is not None and used == used:
        return float(used)
    return 0.0 if row.extra.get(f"{prefix}excess", 0.0) <= 0 else float("inf")


def tensor_row(
    check: str,
    item: str,
    plain: Tensor | None,
    recompute: Tensor | None,
    rtol: float | None,
    atol: float | None,
    role: str = "",
    aa: Any = NO_AA,
) -> Row:
    """Measure how far one tensor of the recompute run is from the plain run's.

    The row is judged by :func:`reportgen.results.judge` with comparator ``allclose`` on the
    ``excess`` column (``max(|a - b| - (atol + rtol |b|))``, <= 0 passes). NaN or Inf in either
    tensor is never equal (excess inf). ``None`` in one run and a tensor in the other has
    excess inf (a gradient that silently vanished); ``None`` in both has excess 0, with a note.

    Args:
        aa: the same tensor from a second, independent plain twin (A/A control); its distance
            from the plain tensor goes in ``aa_max_abs_err`` / ``aa_excess`` beside the row's.
    """
    if plain is None or recompute is None:
        present = plain if plain is not None else recompute
        rt, at = tolerances(present.dtype, rtol, atol) if present is not None else (0.0, 0.0)
        extra = _aa_extra(plain, aa, rt, at)
        if plain is None and recompute is None:
            return allclose_row(
                check, item, "max_abs_err", 0.0, "", role, "None in both runs", {"excess": 0.0, **extra}
            )
        missing = "recompute" if recompute is None else "plain"
        present_in = {"plain_value": "None" if plain is None else "tensor"}
        present_in["recompute_value"] = "None" if recompute is None else "tensor"
        detail = f"None in the {missing} run, a tensor in the other: it would not train the same"
        extra = {"excess": float("inf"), **present_in, **extra}
        return allclose_row(check, item, "max_abs_err", float("inf"), "", role, detail, extra)
    rt, at = tolerances(plain.dtype, rtol, atol)
    d = measure(recompute, plain, rt, at)
    if d.nonfinite_b:
        detail = f"{d.nonfinite_b} non-finite value(s) (NaN/Inf) in the plain run: never equal"
    elif d.nonfinite_a:
        detail = f"{d.nonfinite_a} non-finite value(s) (NaN/Inf) in the recompute run only"
    else:
        detail = (
            ("bitwise equal" + (ALL_ZERO if not plain.count_nonzero() else ""))
            if d.bitwise_equal
            else f"within tolerance (uses {d.tolerance_used:.0%} of it){_near_zero(d)}"
            if d.worst_excess <= 0
            else f"exceeds tolerance by {d.worst_excess:.3g}"
            + (f" ({d.tolerance_used:.3g}× the tolerance)" if d.tolerance_used < float("inf") else "")
        )
    values = _both_values(plain, recompute) if recompute.shape == plain.shape and not d.bitwise_equal else {}
    if recompute.shape != plain.shape:
        detail = f"shape {tuple(recompute.shape)} vs plain {tuple(plain.shape)}"
    elif "values_differing" in values:  # a generator state: how much of it differs, not by how much
        differ = values["values_differing"]
        detail = f"{differ} of its {plain.numel()} values {'differs' if differ == 1 else 'differ'}, where none may"
    extra = {"max_rel_err": d.max_rel_err, "tolerance_used": d.tolerance_used, "bitwise_equal": d.bitwise_equal}
    extra |= {"atol": at, "rtol": rt, "excess": d.worst_excess, "nonfinite_plain": d.nonfinite_b}
    extra |= {"nonfinite_recompute": d.nonfinite_a, **values, **_aa_extra(plain, aa, rt, at)}
    return allclose_row(check, item, "max_abs_err", d.max_abs_err, f"atol={at:g} rtol={rt:g}", role, detail, extra)


#: What a row of two equal, all-zero tensors adds to "bitwise equal": it is no evidence of parity.
ALL_ZERO = ", both all zero: equal, but a zero tensor shows no difference a fault could make"


def allclose_row(
    check: str, item: str, metric: str, value: float, threshold: str, role: str, detail: str, extra: dict
) -> Row:
    """A row judged ``allclose`` on its ``excess`` column (``threshold``: the tolerances for people)."""
    judged: dict[str, Any] = {"comparator": "allclose", "threshold_value": math.nan, "threshold": threshold}
    return Row.measured(check, item, metric, value, "", role=role, detail=detail, extra=extra, **judged)


def _near_zero(d) -> str:
    """A note for a passing tensor whose relative difference looks large: entries near zero,
    where ``atol`` decides, drive it (so the relative figure is not the deciding one)."""
    return (
        f"; its max relative difference {d.max_rel_err:.2g} comes from entries near zero, where atol decides"
        if d.max_rel_err > 0.01
        else ""
    )


def value_row(check: str, item: str, plain: Any, recompute: Any, role: str = "", aa: Any = NO_AA) -> Row:
    """Compare a plain Python value (number, bool, string, length) between the twins: numbers
    by ``abs_diff == 0``, anything else by ``mismatch == 0`` (1 when they differ). ``aa`` is the
    value of a second plain twin (A/A control, column ``aa_excess``: 0 same, inf different)."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (plain, recompute))
    value = abs(float(recompute) - float(plain)) if numeric else float(plain != recompute)
    extra = {
        "plain_value": repr(plain),
        "recompute_value": repr(recompute),
        "excess": 0.0 if plain == recompute else float("inf"),
    }
    if aa is not NO_AA:
        extra["aa_excess"] = 0.0 if aa == plain else float("inf")
    metric = "abs_diff" if numeric else "mismatch"
    return zero_count_row(
        check, item, metric, value, "", role, f"plain={plain!r}, recompute={recompute!r}", extra=extra
    )


def zero_count_row(
    check: str, item: str, metric: str, count: float, unit: str, role: str, detail: str, **more: Any
) -> Row:
    """``count`` (in ``unit``) judged ``== 0``, threshold ``"0"`` for people; ``more``: :meth:`Row.measured`'s
    ``on_miss`` (FAIL, WARN for an advisory count, INCONCLUSIVE for one that breaks the baseline), ``variant``,
    ``seconds``, ``extra``. Counts that must be zero: lost gradients, a twin's drift across ranks, a value
    that differs between the twins, what makes the baseline untrustworthy."""
    judged: dict[str, Any] = {"comparator": "==", "threshold_value": 0.0, "threshold": "0"}
    return Row.measured(check, item, metric, float(count), unit, role=role, detail=detail, **judged, **more)
