"""Rendering a sweep's summary: the verdict matrix, the saving-vs-overhead scatter and the files
summary.csv, summary.json, summary.html and summary.pdf."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from reportgen.checks.base.plots import finish_axes, to_svg
from reportgen.files import atomic_write
from reportgen.report.evidence import no_nan
from reportgen.report.pdf import write_pdf
from reportgen.report.render import environment
from reportgen.results import Status, frame_to_json
from reportgen.sweep.table import job_table, pareto_front


def scatter_svg(jobs: pd.DataFrame, front: pd.DataFrame) -> str:
    """Saved-activation share (x, %) vs overhead ratio (y, with its 95% CI) per job; holds,
    fails and parity failures marked apart; the Pareto front of holding jobs as a step line."""
    from matplotlib.figure import Figure

    measured = jobs[jobs.saved_activation_share.notna() & jobs.overhead_ratio.notna()].copy()
    fig = Figure(figsize=(7.5, 3.4))
    ax = fig.subplots()
    dense = len(measured) > 40  # rasterize point layers of big sweeps: small, fast PDFs
    fails = (measured.verdict != Status.PASS) & ~measured.parity_failed
    groups: list[tuple[str, Any, dict[str, Any]]] = [
        ("holds", measured.verdict == Status.PASS, dict(color="#0a7d2e", marker="o")),
        ("fails (cost or task check)", fails, dict(color="#d0621b", marker="s")),
        ("parity failure", measured.parity_failed, dict(color="#b01c1c", marker="x")),
    ]
    bars: dict[str, Any] = {"ls": "none", "ms": 5, "elinewidth": 0.8, "capsize": 2, "rasterized": dense}
    for label, mask, style in groups:
        part = measured[mask]
        if part.empty:
            continue
        x, y = part.saved_activation_share * 100, part.overhead_ratio
        low = (y - part.overhead_ci_low.fillna(y)).clip(lower=0)
        high = (part.overhead_ci_high.fillna(y) - y).clip(lower=0)
        ax.errorbar(x, y, yerr=[low, high], label=label, **bars, **style)
    if len(front):
        x, y = front.saved_activation_share * 100, front.overhead_ratio
        ax.step(x, y, where="post", color="#0a7d2e", lw=1, ls="--", label="Pareto front (holds)")
    if len(measured) <= 30:
        for _, row in measured.iterrows():
            where = (row.saved_activation_share * 100, row.overhead_ratio)
            ax.annotate(str(row.job), where, fontsize=6, xytext=(3, 3), textcoords="offset points")
    if measured.empty:
        ax.text(0.5, 0.5, "no job measured both costs", ha="center", va="center", transform=ax.transAxes)
    finish_axes(
        fig,
        ax,
        "saved activations, % of the plain twin's (higher is better)",
        "step-time overhead ratio (lower is better)",
    )
    return to_svg(fig)


def summary_view(frame: pd.DataFrame, meta: dict, link_file: str) -> dict:
    """What ``templates/summary.html.j2`` reads: jobs, the verdict matrix, scatter, Pareto front.

    Args:
        frame: :func:`summary_frame`.
        meta: ``{"title", "created", "sweep_dir", "exit_code", "signature", "command", "swept"}``.
        link_file: ``"report.html"`` or ``"report.pdf"``, linked relative to the sweep folder.
    """
    jobs = job_table(frame)
    front = pareto_front(jobs)
    checks = list(dict.fromkeys(c for c in frame.check if isinstance(c, str) and c))
    status = {(j, c): s for j, c, s in zip(frame.job, frame.check, frame.status) if isinstance(c, str)}
    rows = []
    for job in jobs.to_dict("records"):
        job = {k: no_nan(v) for k, v in job.items()}
        report = job["report"]
        job["link"] = f"{report.removesuffix('report.html')}{link_file}" if report else None
        job["cells"] = [status.get((job["job"], c)) for c in checks]
        job["pareto"] = job["job"] in set(front.job)
        job["swept"] = " ".join(f"{k}={job.get(k)}" for k in meta["swept"]) or job["overrides"]
        rows.append(job)
    return {
        "meta": meta,
        "jobs": rows,
        "checks": checks,
        "holding": sum(1 for r in rows if r["verdict"] == Status.PASS),
        "failures": [r for r in rows if r["error"]],
        "scatter": scatter_svg(jobs, front),
        "front": sorted((r for r in rows if r["pareto"]), key=lambda r: r["saved_activation_share"]),
    }


def render_summary(frame: pd.DataFrame, meta: dict, out_dir: Path, pdf: bool = True) -> dict[str, Path]:
    """Write summary.csv, summary.json, summary.html (and summary.pdf, PDF/A-3b with
    summary.json attached) into the sweep folder.

    Raises:
        FileExistsError: a summary exists already in ``out_dir``.
    """
    template = environment().get_template("summary.html.j2")
    out_dir = Path(out_dir)
    table = frame_to_json(frame)
    paths = {
        "csv": atomic_write(out_dir / "summary.csv", frame.to_csv(index=False)),
        "json": atomic_write(out_dir / "summary.json", table),
    }
    paths["html"] = atomic_write(out_dir / "summary.html", template.render(**summary_view(frame, meta, "report.html")))
    if pdf:
        html = template.render(**summary_view(frame, meta, "report.pdf"))  # relative: no path of this machine
        attached = ("summary.json", table.encode(), "Data", "The sweep summary this document was rendered from.")
        paths["pdf"] = atomic_write(
            out_dir / "summary.pdf", write_pdf(html, meta["created"], [attached], relative_links=True)
        )
    return paths
