"""Frame + metadata → view model → ``templates/report.html.j2`` → report.html → report.pdf.

Markup lives only in templates (autoescape on, StrictUndefined); this module shapes data.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup, escape

from reportgen.checks import ROWS_TEMPLATE
from reportgen.checks import section as registered_section
from reportgen.checks.base.plots import section_plots
from reportgen.checks.controls.limit import stated_limit
from reportgen.claim.rows import claim_table
from reportgen.config import CONTROLS
from reportgen.files import atomic_write
from reportgen.memory.step_peak import CATEGORIES
from reportgen.paths import templates_dir
from reportgen.report.evidence import baseline_breaks, lead_evidence, no_nan, tolerance_share
from reportgen.report.guard import guard_costs, guard_sections
from reportgen.report.pdf import write_pdf
from reportgen.results import SEVERITY, Role, Status, check_summary, frame_to_json
from reportgen.trust.statement import row_tolerances

#: How a group of rows (one role) is named when it collapses to one summary line.
ROLE_LABELS: dict[str, str] = {
    Role.LOSS: "loss",
    Role.OUTPUT: "output tensors",
    Role.PARAM_GRAD: "parameter gradients",
    Role.INPUT_GRAD: "input gradient",
    Role.PARAM: "parameters after the step",
    Role.OPTIMIZER_STATE: "optimizer-state tensors",
    Role.BUFFER: "buffers",
    Role.ATTRIBUTE: "plain module attributes",
    Role.RNG: "RNG states",
    Role.WARNING: "torch warnings",
    Role.EXCEPTION: "errors",
    Role.SAVE_OP: "save_ops entries",
}

#: Failing rows shown per group of one section (:func:`row_groups`); the rest is one summary line.
FEW_ROWS = 5


def fmt_num(value: Any) -> str:
    """Numbers for people: 3 significant digits, ``—`` for missing, ``inf`` spelled out."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if math.isinf(value):
            return "inf"
        return f"{value:.3g}" if value != int(value) or abs(value) >= 1e6 else f"{int(value)}"
    return str(value)


def fmt_bytes(value: Any) -> str:
    """Bytes in binary units (KiB, MiB, GiB)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value} TiB"


def fmt_int(value: Any) -> str:
    """An exact integer (e.g. bytes) with thousands separators, ``—`` for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—" if value is None or math.isnan(value) else fmt_num(value)
    return f"{int(value):,}"


#: Characters of a name part (between dots) past which it gets break points of its own.
LONG_PART = 24


def fmt_name(name: Any) -> Markup:
    """A dotted name (``model.embed_tokens.weight.grad``) that may wrap after each dot, never mid-word.

    Escapes the name and puts a ``<wbr>`` after every ``.``, before every ``[`` and inside long parts
    (:func:`_long_part`); the ``code.name`` CSS rule keeps words whole, so a PDF table cell breaks it only there.
    """
    parts = [p for raw in str(name).replace("[", "\x00[").replace(".", ".\x00").split("\x00") for p in _long_part(raw)]
    return Markup("<wbr>").join(escape(p) for p in parts)


def _long_part(part: str) -> list[str]:
    """``part`` cut after each ``_`` when one of its words is longer than :data:`LONG_PART`, and any
    piece still longer than it cut every :data:`LONG_PART` characters."""
    if max(len(word) for word in part.split(" ")) <= LONG_PART:  # spaces break it already
        return [part]
    pieces = [p for p in part.replace("_", "_\x00").split("\x00") if p]
    return [p[i : i + LONG_PART] for p in pieces for i in range(0, len(p), LONG_PART)]


def environment() -> Environment:
    """The jinja2 environment: templates folder, autoescape, StrictUndefined, number filters.

    One per templates folder and process, so each template is compiled once (jinja2 still reloads a
    changed file). Callers only read it: never add filters or globals to the returned environment.
    """
    return _environment(str(templates_dir()))


@functools.lru_cache(maxsize=4)
def _environment(folder: str) -> Environment:
    env = Environment(
        loader=FileSystemLoader(folder),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=fmt_num, bytes=fmt_bytes, exact=fmt_int, name=fmt_name)
    env.globals.update(R=Role, CATEGORIES=CATEGORIES, inf=math.inf)
    return env


def _records(group: pd.DataFrame) -> list[dict]:
    """Rows of one check, worst status first, then the largest share of its tolerance
    (:func:`reportgen.report.evidence.tolerance_share`), then the largest value; NaN as None.

    A stable sort: rows that tie keep the frame's order (a status no severity names goes last).
    """
    order = {s: i for i, s in enumerate(SEVERITY)}
    records = group.to_dict("records")
    share = [-1.0 if math.isnan(x) else x for x in map(tolerance_share, records)]
    value = pd.to_numeric(group.value, errors="coerce").fillna(-1).tolist()
    ranked = sorted(
        range(len(records)), key=lambda i: (order.get(records[i]["status"], len(order)), -share[i], -value[i])
    )
    return [{k: no_nan(v) for k, v in records[i].items()} for i in ranked]


def row_groups(records: list[dict], few: int = FEW_ROWS) -> list[dict]:
    """Rows of one section grouped by ``role`` (first-seen order), for the generic rows table.

    A group of more than one row, all PASS (or INFO), collapses to one summary line. Any other group shows
    at most ``few`` not-passing rows (worst first, as :func:`_records` sorts them) and one line (``more``)
    for the rest; every row stays in results.csv/json and, in the HTML, behind a ``<details>``.

    Returns:
        ``[{"role", "label", "rows", "collapsed", "worst", "statuses", "shown", "more"}]``; ``worst`` is
        the row with the largest value; ``more`` is None or ``{"count", "statuses", "low", "high", "failing"}``
        (low/high: the range of their shares of the tolerance, NaN when the rows have none).
    """
    groups: dict[str, list[dict]] = {}
    for record in records:
        groups.setdefault(record.get("role") or "", []).append(record)
    passing, out = {Status.PASS, Status.INFO}, []
    for role, rows in groups.items():
        statuses = sorted({r["status"] for r in rows}, key=SEVERITY.index)
        values = [r for r in rows if isinstance(r.get("value"), (int, float))]
        worst = max(values, key=lambda r: r["value"]) if values else rows[0]
        bad = [r for r in rows if r["status"] not in passing]
        shown = (bad or rows)[:few] if len(rows) > few + 1 else rows
        rest, more = rows[len(shown) :], None
        if rest:
            shares = [x for x in (tolerance_share(r) for r in rest) if not math.isnan(x)]
            more = {"count": len(rest), "statuses": sorted({r["status"] for r in rest}, key=SEVERITY.index)}
            more |= {"low": min(shares, default=math.nan), "high": max(shares, default=math.nan)}
            more["failing"] = sum(r["status"] not in passing for r in rest)
        group: dict[str, Any] = {"role": role, "label": ROLE_LABELS.get(role, role or "rows"), "rows": rows}
        collapsed = len(rows) > 1 and set(statuses) <= passing
        out.append(group | {"worst": worst, "statuses": statuses, "collapsed": collapsed, "shown": shown, "more": more})
    return out


def view_model(frame: pd.DataFrame, meta: dict, verdict: str, required: list[str]) -> dict:
    """What the templates read: metadata, verdict, per-check summary and sections.

    Each section's intro, template and plotter come from the check registry
    (reportgen/checks/__init__.py); a check name the registry does not know (e.g. rows of a
    removed check) gets the generic rows table.
    """
    summary = check_summary(frame, required)
    sections = []
    for check, status in zip(summary.check, summary.status):
        group, spec = frame[frame.check == check], registered_section(check)
        intro, template, plotter = (spec.intro, spec.template, spec.plotter) if spec else ("", ROWS_TEMPLATE, None)
        section = {"check": check, "status": status, "intro": intro, "anchor": check.replace(" ", "-")}
        records, plots = _records(group), section_plots(plotter, group)
        sections.append(
            section | {"rows": records, "groups": row_groups(records), "template": template, "plots": plots}
        )
    sections = guard_sections(environment(), sections)  # a missing value never stops the report
    return {
        "meta": meta,
        "verdict": verdict,
        "summary": summary.to_dict("records"),
        "sections": sections,
        "baseline": baseline_breaks(frame),
        "costs": guard_costs(headline_costs, frame),
        "why": lead_evidence(frame, required),
        "cached": cached_runs(frame),
        "cache_rejected": rejected_cache_entries(frame),
        "rounded": passed_at_rounding_level(frame),
        "clauses": claim_table(frame),
        "tolerances_used": row_tolerances(frame)["used"],  # the statement signs the same list; verify re-derives it
        "limit": stated_limit(frame),  # the detection limit beside the tolerances; verify re-derives it
        "rank_peaks": rank_peaks(frame),
    }


def rank_peaks(frame: pd.DataFrame) -> list[dict]:
    """Each rank's own peak of a sharded run, for page 1: ``[{"rank", "rss_bytes", "allocated_bytes"}]`` in rank
    order from the ``run_peak_rss_bytes`` rows every rank adds (``reportgen.distributed.ranks.peak_row``); empty
    for a run on one process."""
    if "rank" not in frame.columns:
        return []
    rows = frame[(frame.metric == "run_peak_rss_bytes") & frame["rank"].notna()].sort_values("rank")
    allocated = rows["run_peak_allocated_bytes"] if "run_peak_allocated_bytes" in rows.columns else None
    return [
        {
            "rank": int(rank),
            "rss_bytes": float(value),
            "allocated_bytes": None if allocated is None or pd.isna(allocated[i]) else float(allocated[i]),
        }
        for i, rank, value in zip(rows.index, rows["rank"], rows["value"], strict=True)
    ]


def cached_runs(frame: pd.DataFrame) -> list[dict]:
    """Training runs loaded from the plain-twin cache (``reportgen.training.cache``): ``[{"item", "key", "seconds",
    "draws"}]`` (``seconds``: wall time spent proving the entry, s; ``draws``: training batches drawn again; NaN in
    results written before they were recorded)."""
    if "cache_key" not in frame.columns:
        return []
    hits = frame[(frame.role == Role.RUN) & frame.cache_key.notna()]
    return [
        {
            "item": f"{r['check']}, {r['item']}",
            "key": r["cache_key"],
            "seconds": float(r.get("cache_proof_seconds", float("nan"))),
            "draws": r.get("cache_draws", float("nan")),
        }
        for r in hits.to_dict("records")
    ]


def passed_at_rounding_level(frame: pd.DataFrame) -> list[dict]:
    """Rows outside tolerance that passed only because they lie within their rounding envelope
    (``excess > 0``, ``rounding_excess <= 0``; reportgen/rounding.py), so page 1 can say the
    verdict leans on it: ``[{"check", "item"}]``, one per row (aggregate rows included)."""
    if "rounding_excess" not in frame.columns:
        return []
    excess = pd.to_numeric(frame.get("excess"), errors="coerce")
    rounding = pd.to_numeric(frame.rounding_excess, errors="coerce")
    hits = frame[(excess > 0) & (rounding <= 0) & (frame.status == "PASS")]
    return [{"check": r["check"], "item": r["item"]} for r in hits.to_dict("records")]


def rejected_cache_entries(frame: pd.DataFrame) -> list[dict]:
    """Plain-twin cache entries that were not trusted (``Role.CACHE`` rows): ``[{"item", "key", "why"}]``."""
    rows = frame[frame.role == Role.CACHE]
    return [
        {"item": f"{r['check']}, {r['item']}", "key": r.get("cache_key"), "why": r.get("cache_problem")}
        for r in rows.to_dict("records")
    ]


def _role_row(frame: pd.DataFrame, role: str, variant: str = "recompute") -> pd.Series | None:
    hit = frame[(frame.role == role) & (frame.variant == variant)]
    return hit.iloc[0] if len(hit) else None


def headline_costs(frame: pd.DataFrame) -> dict:
    """Page-1 figures of the claim's cost, read from the frame by role: saved-activation bytes and the step
    peak of both twins with the share saved (the ``saving`` and ``peak_saving`` rows), the step-time overhead
    ratio with its 95% CI (the ``overhead`` row) and the seconds the detector controls added (``total time``).

    Returns:
        ``{"memory" and "peak": {"plain", "recompute", "saved" (B), "share", "status"} | None,
        "time": {"ratio", "low", "high", "status"} | None, "controls": float | None}``; None = not
        measured (the template says so).
    """

    def saved(role: str, prefix: str) -> dict | None:
        row = _role_row(frame, role)
        if row is None or pd.isna(row.value) or pd.isna(row.get(f"plain_{prefix}bytes")):
            return None
        figures = (
            ("plain", "recompute", "saved"),
            (f"plain_{prefix}bytes", f"recompute_{prefix}bytes", f"{prefix}saving_bytes"),
        )
        return {**{k: row[c] for k, c in zip(*figures, strict=True)}, "share": row.value, "status": row.status}

    memory, peak, overhead = saved(Role.SAVING, ""), saved(Role.PEAK_SAVING, "peak_"), _role_row(frame, Role.OVERHEAD)
    time = None
    if overhead is not None and pd.notna(overhead.value):
        low, high = (no_nan(overhead.get(k)) for k in ("ci_low", "ci_high"))
        time = {"ratio": overhead.value, "low": low, "high": high, "status": overhead.status}
    spent = pd.to_numeric(frame[(frame.check == CONTROLS) & (frame.item == "total time")].value, errors="coerce")
    return {"memory": memory, "peak": peak, "time": time, "controls": no_nan(spent.iloc[0]) if len(spent) else None}


def render_html(frame: pd.DataFrame, meta: dict, verdict: str, required: list[str] | None = None) -> str:
    """report.html as text: the view model through ``templates/report.html.j2``."""
    return render_pages(frame, meta, verdict, required)[0]


def render_pages(frame: pd.DataFrame, meta: dict, verdict: str, required: list[str] | None = None) -> tuple[str, str]:
    """``(report.html, the HTML the PDF is laid out from)``, from one view model (plots drawn once).

    The two differ only in what a page cannot hold: the PDF's HTML leaves out the
    ``<details>`` blocks that repeat every row of a collapsed table (they are in results.csv
    and results.json, attached to the PDF, and in report.html), which also spares WeasyPrint
    the styles and layout of hundreds of hidden rows.
    """
    template = environment().get_template("report.html.j2")
    model = view_model(frame, meta, verdict, list(required or []))
    return template.render(**model, medium="html"), template.render(**model, medium="pdf")


def render_report(
    frame: pd.DataFrame, meta: dict, verdict: str, out_dir: Path, pdf: bool = True, required: list[str] | None = None
) -> dict[str, Path]:
    """Write report.html (and report.pdf, PDF/A-3b with results.json attached) into ``out_dir``.

    The PDF is unsigned here; ``signing.sign_run`` signs it afterwards when signing is on.
    With ``SOURCE_DATE_EPOCH`` fixed, the same frame and metadata give byte-identical files.

    Returns:
        ``{"html": path, "pdf": path}`` of what was written.

    Raises:
        FileExistsError: a report exists already in ``out_dir``.
    """
    html, pdf_html = render_pages(frame, meta, verdict, required)
    paths = {"html": atomic_write(out_dir / "report.html", html)}
    if pdf:
        about = "The results frame this report was rendered from (reportgen.results.frame_to_json)."
        results = ("results.json", frame_to_json(frame).encode(), "Data", about)
        paths["pdf"] = atomic_write(out_dir / "report.pdf", write_pdf(pdf_html, meta["created"], [results]))
    return paths
