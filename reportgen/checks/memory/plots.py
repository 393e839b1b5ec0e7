"""The warm-step memory check's plot: saved-activation bars, plain vs recompute (:func:`memory_plots`)."""

from __future__ import annotations

import pandas as pd

from reportgen.checks.base.plots import PLAIN_COLOR, RECOMPUTE_COLOR, Plot, to_svg
from reportgen.results import Role


def memory_plots(rows: pd.DataFrame) -> list[Plot]:
    """Saved-activation bars, plain vs recompute, per wrapped module and in total (MiB).

    Reads the ``saved_activation_bytes`` rows of the warm-step memory check: per-module rows
    carry ``module`` and ``module_order``; totals have item ``saved activations (total)``.
    """
    from matplotlib.figure import Figure

    saved = rows[rows.role.isin([Role.SAVED_TOTAL, Role.SAVED_MODULE])].copy()
    if saved.empty:
        return []
    saved["value"] = pd.to_numeric(saved.value, errors="coerce") / 2**20
    per_module = saved[saved.role == Role.SAVED_MODULE].copy()
    totals = saved[saved.role == Role.SAVED_TOTAL].set_index("variant").value
    modules = []
    if not per_module.empty:
        per_module["module_order"] = pd.to_numeric(per_module.module_order, errors="coerce")
        modules = list(per_module.sort_values("module_order").module.drop_duplicates())[:24]
    labels = modules + ["total"]
    height = 0.8 + 0.28 * len(labels)
    fig = Figure(figsize=(7.5, min(height, 7.5)))
    ax = fig.subplots()
    for i, (variant, color) in enumerate((("plain", PLAIN_COLOR), ("recompute", RECOMPUTE_COLOR))):
        values = [
            float(per_module[(per_module.module == m) & (per_module.variant == variant)].value.sum()) for m in modules
        ] + [float(totals.get(variant, float("nan")))]
        ypos = [k + (i - 0.5) * 0.4 for k in range(len(labels))]
        ax.barh(ypos, values, height=0.4, color=color, label=variant, rasterized=True)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("saved activations, MiB", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return [
        Plot(
            to_svg(fig),
            "Bytes autograd keeps for backward, plain vs recompute: per wrapped module, the rest of "
            "the model, and in total (each storage counted once).",
        )
    ]
