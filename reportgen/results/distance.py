"""Measure how far two tensors are apart; judge against assert_close-style tolerances.

Measuring and judging are separate (as deepchecks separates checks from conditions):
:func:`measure` returns numbers; :func:`reportgen.results.judge` turns them into a status.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: torch.testing.assert_close defaults ``(rtol, atol)`` per dtype, from its documentation
#: (https://pytorch.org/docs/stable/testing.html#torch.testing.assert_close).
DEFAULT_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def tolerances(dtype: torch.dtype, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """``(rtol, atol)``: configured values, else assert_close's defaults for ``dtype`` (a complex dtype's are its real
    dtype's, as assert_close's; 0, 0 for integer and bool tensors, which must match exactly)."""
    default = DEFAULT_TOLERANCES.get(dtype.to_real() if dtype.is_complex else dtype, (0.0, 0.0))
    return (default[0] if rtol is None else rtol), (default[1] if atol is None else atol)


@dataclass
class Distance:
    """How two tensors differ.

    NaN and Inf are never "equal" (``torch.testing.assert_close`` defaults to
    ``equal_nan=False``): a non-finite element in either tensor makes the distance infinite.

    Attributes:
        max_abs_err: ``max |a - b|`` (inf when shapes differ or any element is not finite,
            0 for two empty tensors).
        max_rel_err: ``max |a - b| / |b|`` over elements with ``b != 0``.
        bitwise_equal: every element identical and finite.
        worst_excess: ``max(|a - b| - (atol + rtol |b|))``; <= 0 means within tolerance.
        tolerance_used: ``max |a - b| / (atol + rtol |b|)``, the share of its own tolerance the
            worst element uses: <= 1 passes, so this is the number that decides the row (inf for a
            difference where the tolerance is 0). ``max_rel_err`` can be large on a passing
            tensor when entries near zero differ by less than ``atol``.
        nonfinite_a: NaN/Inf elements in ``a`` (the recompute tensor).
        nonfinite_b: NaN/Inf elements in ``b`` (the plain tensor).
    """

    max_abs_err: float
    max_rel_err: float
    bitwise_equal: bool
    worst_excess: float
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    tolerance_used: float = 0.0


def nonfinite_count(t: Tensor) -> int:
    """Number of NaN or Inf elements (0 for integer and bool tensors)."""
    return int((~torch.isfinite(t)).sum()) if t.is_floating_point() or t.is_complex() else 0


def measure(a: Tensor, b: Tensor, rtol: float, atol: float) -> Distance:
    """Distance of ``a`` (recompute) from ``b`` (plain), with assert_close's closeness rule
    ``|a - b| <= atol + rtol * |b|``, computed in float64; complex tensors in both parts, each compared as a real
    number (``torch.view_as_real``)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return Distance(float("inf"), float("inf"), False, float("inf"), tolerance_used=float("inf"))
    if a.numel() == 0:
        return Distance(0.0, 0.0, True, 0.0)
    a, b = a.detach(), b.detach()
    if b.is_complex():
        a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
    floating = b.is_floating_point() or b.is_complex()
    if a.device != b.device:  # a copy kept on the host beside a live twin's tensor: compared chunk by chunk
        if floating:
            return _chunked(a.reshape(-1), b.reshape(-1), rtol, atol)
        a = a.to(b.device)  # integers and bools (counters, generator states): small, and judged exactly
    if torch.equal(a, b):  # bitwise equal, so no NaN (NaN != NaN); finite unless an Inf sits in both
        if not floating:  # integers and bools: exact, no margin from rtol beyond atol
            return Distance(0.0, 0.0, True, -atol)
        low, high = torch.aminmax(b.abs())
        if bool(torch.isfinite(high)):
            # The common case, a few passes instead of a dozen: no difference anywhere, and the
            # excess is the margin the smallest |b| leaves, -(atol + rtol * min |b|).
            return Distance(0.0, 0.0, True, -(atol + rtol * float(low)))
    return _chunked(a.reshape(-1), b.reshape(-1), rtol, atol)


#: Elements per float64 chunk of :func:`measure` (32 MiB per temporary).
CHUNK = 1 << 22


def _chunked(a: Tensor, b: Tensor, rtol: float, atol: float) -> Distance:
    """:func:`measure`'s float64 arithmetic on flat ``a`` and ``b``, :data:`CHUNK` elements at a time on
    their device (the accelerator's when one of them is on the host: that one's chunks travel), never a
    float64 copy of the whole tensor, with one host synchronisation for all the figures."""
    device = a.device if a.device.type != "cpu" else b.device  # an accelerator when either is on one
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=device)
    zero = torch.zeros((), dtype=torch.float64, device=device)
    diff_max, rel_max, excess, used = -inf, -inf, -inf, zero.clone()
    bad_a, bad_b, any_nonzero, unequal = zero.clone(), zero.clone(), zero.clone(), zero.clone()
    for start in range(0, b.numel(), CHUNK):
        a64 = a[start : start + CHUNK].to(device, torch.float64)
        b64 = b[start : start + CHUNK].to(device, torch.float64)
        finite_a, finite_b = torch.isfinite(a64), torch.isfinite(b64)
        bad_a += (~finite_a).sum()
        bad_b += (~finite_b).sum()
        diff = (a64 - b64).abs().masked_fill(~(finite_a & finite_b), float("inf"))
        nonzero = b64 != 0
        any_nonzero = torch.maximum(any_nonzero, nonzero.any().double())
        rel_max = torch.maximum(rel_max, torch.where(nonzero, diff / b64.abs(), -inf).max())
        diff_max = torch.maximum(diff_max, diff.max())
        allowed = atol + rtol * b64.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)
        excess = torch.maximum(excess, (diff - allowed).max())
        used = torch.maximum(used, torch.where(diff == 0, 0.0, diff / allowed).max())  # x/0 = inf: nothing allowed
        unequal += (a64 != b64).sum()
    figures = torch.stack([diff_max, rel_max, excess, used, bad_a, bad_b, any_nonzero, unequal]).tolist()
    diff_max, rel_max, excess, used, bad_a, bad_b, any_nonzero, unequal = figures
    rel = rel_max if any_nonzero else (0.0 if diff_max == 0 else float("inf"))
    bitwise = not unequal and not (bad_a or bad_b)
    return Distance(diff_max, rel, bitwise, excess, int(bad_a), int(bad_b), used)
