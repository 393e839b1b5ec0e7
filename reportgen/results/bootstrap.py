"""The paired bootstrap of a step-time overhead ratio, shared by the timing checks (one process,
and the slowest rank per step of a sharded run)."""

from __future__ import annotations

import numpy as np


def bootstrap_ratio_ci(
    plain_ms, recompute_ms, samples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """Overhead ratio (median over rounds of recompute/plain) and its percentile-bootstrap CI.

    Round ``i``'s two steps ran back to back, so their ratio cancels drift that both share
    (load, clocks, caches): this paired estimator gives a narrower interval than the ratio of
    the two medians for the same rounds (measured on the gpt default: ±1.5–2.1 vs ±1.8–2.6
    percentage points). Rounds are resampled with replacement.

    Args:
        plain_ms: step times of the plain twin, ``[rounds]``, ms.
        recompute_ms: step times of the recompute twin, ``[rounds]``, ms (same rounds).
        samples: bootstrap resamples.
        seed: seed of ``numpy.random.default_rng``.
        level: coverage of the interval (0.95 = 95%).

    Returns:
        ``(ratio, low, high)``, dimensionless.

    Raises:
        ValueError: the two samples are not paired (different lengths, empty, not 1-D).
    """
    p, r = np.asarray(plain_ms, dtype=float), np.asarray(recompute_ms, dtype=float)
    if p.shape != r.shape or p.ndim != 1 or not len(p):
        raise ValueError(f"need two equal-length 1-D samples, got {p.shape} and {r.shape}")
    per_round = r / p
    idx = np.random.default_rng(seed).integers(0, len(p), size=(samples, len(p)))
    ratios = np.median(per_round[idx], axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(np.median(per_round)), float(low), float(high)
