"""SVG plots built from the results frame (matplotlib's SVG backend, no pyplot).

Each plot reads only rows of the frame, like the templates, selected by ``role``. A check's
registry record (reportgen/checks/__init__.py) names its plotter,
``fn(rows_of_that_check) -> list[Plot]``. Point layers are rasterised (``rasterized=True``)
so WeasyPrint does not draw them point by point; axes and text stay vector.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from reportgen.results import Role

#: The colours of the plain and the recompute twin in every plot.
PLAIN_COLOR, RECOMPUTE_COLOR = "#1f5fa8", "#d0621b"


@dataclass
class Plot:
    """An inline SVG figure (``svg`` is markup, trusted: we made it) and its caption."""

    svg: str
    caption: str


def to_svg(fig) -> str:
    """Serialise a matplotlib figure to an SVG string with deterministic ids (no dates, fixed
    hashsalt) so two renders of the same frame are byte-identical.

    Build figures with ``matplotlib.figure.Figure`` (no pyplot state, no GUI backend)."""
    import matplotlib
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    if isinstance(fig.get_layout_engine(), PlaceHolderLayoutEngine):  # left by a one-time tight_layout():
        fig.set_layout_engine(None)  # savefig would lay out nothing but still pre-draw the figure (same bytes)
    for ax in fig.axes:  # data layers (lines z=2, patches and collections z=1) as one image; axes, grid, text vector
        ax.set_rasterization_zorder(2.4)
    buf = io.StringIO()
    # Text as <text> in the report's own font (WeasyPrint draws it like the page's text);
    # glyphs as paths cost WeasyPrint a path per character.
    with matplotlib.rc_context(
        {"svg.hashsalt": "reportgen", "svg.fonttype": "none", "font.family": ["DejaVu Sans"], "savefig.dpi": 150}
    ):
        # No bbox_inches="tight": every plotter lays its figure out with tight_layout already, and a
        # tight bounding box costs a second draw of the figure. One draw per figure, at savefig.
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "reportgen"})
    text = buf.getvalue()
    return text[text.index("<svg") :]


def finish_axes(fig, ax, xlabel: str, ylabel: str) -> None:
    """The house style of every plot: 8-pt labels, 7-pt ticks and legend, light grid, tight layout."""
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()


def section_plots(plotter: Callable[[pd.DataFrame], list[Plot]] | None, rows: pd.DataFrame) -> list[dict]:
    """Plots for one check's section as ``[{"svg": ..., "caption": ...}]`` (empty when none).

    ``plotter`` comes from the check's registry record. A plot that fails to draw is skipped
    with its error as the caption: the report renders.
    """
    if plotter is None:
        return []
    try:
        return [{"svg": p.svg, "caption": p.caption} for p in plotter(rows)]
    except Exception as exc:  # noqa: BLE001 - a plot never stops the report
        return [{"svg": "", "caption": f"plot unavailable: {type(exc).__name__}: {exc}"}]


# --- task metrics and the larger-batch experiment ------------------------------------------
def role_rows(rows: pd.DataFrame, role: str, *numeric: str) -> pd.DataFrame:
    """The rows of one ``role`` (a copy), with ``value`` and each column in ``numeric`` as numbers
    (NaN where missing: a frame read back from results.json may hold None)."""
    picked = rows[rows.role == role].copy()
    for col in ("value", *numeric):
        if col in picked.columns:
            picked[col] = pd.to_numeric(picked[col], errors="coerce")
    return picked


def _curves(rows: pd.DataFrame) -> pd.DataFrame:
    """Learning-curve rows (metric ``curve_<metric>``) with numeric ``accepted_examples``."""
    return role_rows(rows, Role.CURVE, "accepted_examples", "seed", "batch_size")


def task_metric_plots(rows: pd.DataFrame) -> list[Plot]:
    """Learning curves (held-out task metric vs accepted examples), one panel per seed, plain
    solid and recompute dashed; plus the per-point |recompute - plain| when any is non-zero.

    Reads the ``curve_<metric>`` rows of the task-metrics check (columns ``seed``,
    ``accepted_examples``, ``variant``, ``value``).
    """
    from matplotlib.figure import Figure

    curves = _curves(rows)
    if curves.empty:
        return []
    metric = curves.metric.iloc[0].removeprefix("curve_")
    seeds = sorted(curves.seed.dropna().unique())
    fig = Figure(figsize=(7.5, 2.5))
    axes: Any = fig.subplots(1, len(seeds), sharey=True, squeeze=False)[0]
    diffs = []
    for ax, seed in zip(axes, seeds):
        per_seed = curves[curves.seed == seed]
        lines = {}
        for variant, style in (
            ("plain", dict(color=PLAIN_COLOR, lw=2.2)),
            ("recompute", dict(color=RECOMPUTE_COLOR, lw=1.2, ls="--")),
        ):
            part = per_seed[per_seed.variant == variant].sort_values("accepted_examples")
            ax.plot(part.accepted_examples, part.value, label=variant, rasterized=True, **style)
            lines[variant] = part.set_index("accepted_examples").value
        if len(lines) == 2:
            joined = pd.concat(lines, axis=1).dropna()
            diffs.append((seed, (joined.recompute - joined.plain).abs()))
        ax.set_title(f"seed {int(seed)}", fontsize=9)
        ax.set_xlabel("accepted examples", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out {metric}", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    plots = [
        Plot(
            to_svg(fig),
            f"Learning curves: held-out {metric} after each block of accepted examples; recompute "
            "(dashed) is drawn over plain (solid), so identical curves overlap.",
        )
    ]
    if any((d > 0).any() for _, d in diffs):
        fig = Figure(figsize=(7.5, 2.3))
        ax = fig.subplots()
        for seed, d in diffs:
            ax.plot(d.index, d.values, marker="o", ms=3, label=f"seed {int(seed)}")
        finish_axes(fig, ax, "accepted examples", f"|recompute − plain| {metric}")
        plots.append(
            Plot(
                to_svg(fig),
                f"How far the twins drift apart: |recompute − plain| held-out {metric} at each "
                "learning-curve point, per seed.",
            )
        )
    return plots


def larger_batch_plots(rows: pd.DataFrame) -> list[Plot]:
    """The batch search (criterion bytes vs batch, reference line) and learning curves of the
    larger batch against the plain run at the base batch.

    Reads the larger-batch rows: probes are rows whose ``item`` starts with ``recompute at batch``
    (columns ``batch_size``, ``fits``, ``threshold`` = reference bytes); curves are
    ``curve_<metric>`` rows (columns ``seed``, ``batch_size``, ``accepted_examples``).
    """
    from matplotlib.figure import Figure

    plots = []
    probes = role_rows(rows, Role.PROBE, "batch_size")
    if not probes.empty:
        fits = probes.fits.astype(bool)
        reference = float(probes.reference_bytes.iloc[0])
        found = rows[rows.role == Role.BATCH_FOUND]
        fig = Figure(figsize=(7.5, 2.4))
        ax = fig.subplots()
        ax.axhline(reference / 2**20, color="#1f5fa8", lw=1.5, label="plain at the base batch (reference)")
        for part, color, marker, size, label in (
            (fits, "#0a7d2e", "o", 18, "fits"),
            (~fits, "#b01c1c", "x", 22, "does not fit"),
        ):
            x, y = probes.batch_size[part], probes.value[part] / 2**20
            ax.scatter(x, y, color=color, marker=marker, s=size, label=label, rasterized=True)
        if not found.empty and pd.notna(found.value.iloc[0]):
            ax.axvline(float(found.value.iloc[0]), color="#5a2a7a", ls=":", lw=1.2, label="batch found")
        ax.set_xscale("log", base=2)
        finish_axes(fig, ax, "batch size, examples (recompute twin)", f"{probes.metric.iloc[0]}, MiB")
        plots.append(
            Plot(
                to_svg(fig),
                "Batch search: memory of the recompute twin at each probed batch (doubling, then "
                "bisection) against the plain twin's at the base batch.",
            )
        )
    curves = _curves(rows)
    if not curves.empty:
        metric = curves.metric.iloc[0].removeprefix("curve_")
        fig = Figure(figsize=(7.5, 2.4))
        ax = fig.subplots()
        batches = sorted(curves.batch_size.dropna().unique())
        colors = ["#1f5fa8", "#d0621b", "#0a7d2e", "#5a2a7a"]
        for i, batch in enumerate(batches):
            for j, (_, part) in enumerate(curves[curves.batch_size == batch].groupby("seed")):
                part = part.sort_values("accepted_examples")
                ax.plot(
                    part.accepted_examples,
                    part.value,
                    color=colors[i % len(colors)],
                    alpha=0.85,
                    lw=1.3,
                    label=f"batch {int(batch)}" if j == 0 else None,
                )
        finish_axes(fig, ax, "accepted examples", f"held-out {metric}")
        plots.append(
            Plot(
                to_svg(fig),
                f"Held-out {metric} vs accepted examples, one line per seed: the larger batch "
                "(recompute twin) against the plain twin at the base batch. A second experiment, "
                "not a parity test.",
            )
        )
    return plots


# --- trajectory parity ----------------------------------------------------------------------
def trajectory_plots(rows: pd.DataFrame) -> list[Plot]:
    """The largest share of its tolerance any compared item uses after each step
    (|twin - plain| / (atol + rtol |plain|), 1 = at the tolerance): recompute vs plain and the
    A/A control (0 when it reproduced everything), on one log axis with the tolerance line.

    Reads the ``trajectory`` rows (columns ``step``, ``variant``, ``value``).
    """
    from matplotlib.figure import Figure

    steps = role_rows(rows, Role.TRAJECTORY, "step")
    if steps.empty:
        return []
    fig = Figure(figsize=(7.5, 2.3))
    ax = fig.subplots()
    floor = 1e-4  # zero differences (and shares below it) drawn at the floor of the log axis
    for variant, color, label in (
        ("recompute", RECOMPUTE_COLOR, "recompute vs plain"),
        ("aa", PLAIN_COLOR, "plain vs plain (A/A)"),
    ):
        part = steps[steps.variant == variant].sort_values("step")
        ax.plot(part.step, part.value.clip(lower=floor), marker="o", ms=3, lw=1.2, color=color, label=label)
    ax.set_yscale("log")
    ax.axhline(1.0, color="#888888", ls="--", lw=0.8, label="tolerance")
    finish_axes(fig, ax, "optimizer step", "share of tolerance used")
    return [
        Plot(
            to_svg(fig),
            f"After each step, the largest share of its tolerance any item uses (above 1 is outside "
            f"tolerance, unless within the rounding envelope; shares below {floor:g}, exact equality "
            "included, are drawn at it). A recompute line above the A/A line is a difference recomputation made.",
        )
    ]
