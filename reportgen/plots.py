"""SVG plots built from the results frame (matplotlib's SVG backend, no pyplot).

Each plot reads only rows of the frame, like the templates. ``PLOTTERS`` maps a check name
to ``fn(rows_of_that_check) -> list[Plot]``; checks without an entry get no plot.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable

import pandas as pd


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

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "reportgen", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "reportgen"})
    text = buf.getvalue()
    return text[text.index("<svg"):]


PLOTTERS: dict[str, Callable[[pd.DataFrame], list[Plot]]] = {}


def section_plots(check: str, rows: pd.DataFrame) -> list[dict]:
    """Plots for one check's section as ``[{"svg": ..., "caption": ...}]`` (empty when none).

    A plot that fails to draw is skipped with its error as the caption: the report renders.
    """
    plotter = PLOTTERS.get(check)
    if plotter is None:
        return []
    try:
        return [{"svg": p.svg, "caption": p.caption} for p in plotter(rows)]
    except Exception as exc:  # noqa: BLE001 - a plot never stops the report
        return [{"svg": "", "caption": f"plot unavailable: {type(exc).__name__}: {exc}"}]
