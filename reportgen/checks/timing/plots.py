"""The warm-step time check's plot: step-time distributions and the steps in order (:func:`timing_plots`)."""

from __future__ import annotations

import pandas as pd

from reportgen.checks.base.plots import PLAIN_COLOR, RECOMPUTE_COLOR, Plot, role_rows, to_svg
from reportgen.results import Role


def timing_plots(rows: pd.DataFrame) -> list[Plot]:
    """Step-time distributions (box and points per variant) and the measured steps in order.

    Reads the per-step ``step_time_ms`` rows of the warm-step time check (column ``step_index``).
    """
    from matplotlib.figure import Figure

    steps = role_rows(rows, Role.STEP, "step_index")
    if steps.empty:
        return []
    fig = Figure(figsize=(7.5, 2.6))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.6]})
    data = [steps[steps.variant == v].sort_values("step_index") for v in ("plain", "recompute")]
    left.boxplot([d.value for d in data], tick_labels=["plain", "recompute"], widths=0.5, showfliers=False)
    for i, (d, color) in enumerate(zip(data, (PLAIN_COLOR, RECOMPUTE_COLOR)), start=1):
        jitter = [(k % 7 - 3) * 0.03 for k in range(len(d))]
        left.scatter([i + j for j in jitter], d.value, s=8, color=color, alpha=0.7, zorder=3, rasterized=True)
        right.plot(
            d.step_index,
            d.value,
            marker="o",
            ms=2.5,
            lw=1,
            color=color,
            label=("plain", "recompute")[i - 1],
            rasterized=True,
        )
    left.set_ylabel("step time, ms", fontsize=8)
    right.set_xlabel("measured round", fontsize=8)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return [
        Plot(
            to_svg(fig),
            "Step-time distributions (box: quartiles; points: every measured step) and the same "
            "steps in the order they ran, plain and recompute interleaved.",
        )
    ]
