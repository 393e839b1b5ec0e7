"""Rounding-level noise, measured (docs/verdict.md, "Rounding is not a fault"): the *rounding twin* is a plain
twin whose gradients are nudged before every optimizer step by the tolerance gradient parity allows
(:class:`GradientNudge`); its distance from the plain twin per tensor is the *rounding envelope*
(:func:`envelope`). A recompute difference outside tolerance but within ``parity.rounding_factor`` × that
envelope is at rounding level, but only while the recompute gradients are (:func:`grads_at_rounding_level`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from reportgen.results.distance import measure, tolerances

#: Added to the run's seed for the rounding twin's sign generator (any fixed number; it only
#: has to be the same in every run of the same config).
NOISE_SEED_OFFSET = 0x5EED


class GradientNudge:
    """Nudges gradients by the gradient tolerance with random signs from its own seeded generator (reproducible;
    the generators the model draws from are never touched).

    Args:
        rtol, atol: the parity tolerances (``setup.tolerance()``); None = each gradient's
            dtype's ``torch.testing.assert_close`` default (:func:`reportgen.results.distance.tolerances`).
        seed: the run's seed; the sign generator is seeded with ``seed + NOISE_SEED_OFFSET``.
    """

    def __init__(self, rtol: float | None, atol: float | None, seed: int) -> None:
        self.rtol, self.atol = rtol, atol
        self.generator = torch.Generator().manual_seed(int(seed) + NOISE_SEED_OFFSET)

    def __call__(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Add ``±(atol + rtol·|g|)`` to every element of every floating ``p.grad`` in place
        (signs drawn on the CPU in parameter order, then moved to the gradient's device)."""
        for p in params:
            g = p.grad
            if g is None or not g.is_floating_point():
                continue
            rt, at = tolerances(g.dtype, self.rtol, self.atol)
            sign = torch.randint(0, 2, g.shape, generator=self.generator).mul_(2).sub_(1)
            delta = (g.detach().abs().double() * rt + at) * sign.to(g.device, torch.float64)
            g.add_(delta.to(g.dtype))


def envelope(plain: Mapping[str, Tensor | None], rounding: Mapping[str, Tensor | None]) -> dict[str, float]:
    """Per name, the rounding envelope: ``max |rounding - plain|`` of a floating tensor, float64.

    Names missing in either, non-floating tensors (counters, generator states) and tensors of
    different shapes get no envelope: they must match as before.
    """
    out = {}
    for name, p in plain.items():
        q = rounding.get(name)
        if p is None or q is None or not p.is_floating_point() or p.shape != q.shape or p.dtype != q.dtype:
            continue
        out[name] = measure(q, p, 0.0, 0.0).max_abs_err
    return out


def grads_at_rounding_level(
    plain: Mapping[str, Tensor | None],
    recompute: Mapping[str, Tensor | None],
    rounding: Mapping[str, Tensor | None] | None,
    rtol: float | None,
    atol: float | None,
    factor: float,
) -> bool:
    """True when every recompute gradient is within tolerance of the plain one, or within
    ``factor`` × the rounding twin's own (un-nudged) gradient difference at that step.

    The premise of the envelope: it models gradient differences of tolerance size. A fault that
    changes gradients (dropout masks not replayed, a lost gradient) fails this and keeps its
    verdict. ``rounding`` None: tolerance alone (before the first step both plain twins agree).
    """
    if set(plain) != set(recompute):
        return False
    floor = envelope(plain, rounding) if rounding is not None else {}
    for name, p in plain.items():
        r = recompute[name]
        if p is None or r is None:
            if p is not r:
                return False
            continue
        rt, at = tolerances(p.dtype, rtol, atol)
        d = measure(r, p, rt, at)
        if not (d.worst_excess <= 0 or d.max_abs_err <= factor * floor.get(name, 0.0)):
            return False
    return True
