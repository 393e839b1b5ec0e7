"""Frame + metadata → view model → ``templates/report.html.j2`` → report.html → report.pdf.

Markup lives only in templates (autoescape on, StrictUndefined); this module shapes data.
"""
from __future__ import annotations

import datetime as dt
import io
import math
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from .paths import templates_dir
from .plots import section_plots
from .render_guard import guard_costs, guard_sections
from .results import ERROR, FAIL, NOT_RUN, SEVERITY, WARN, atomic_write, check_summary, frame_to_json

#: Section order and the sentence that introduces each check in the report.
SECTION_INTRO = {
    "gradient parity": "One forward and backward on the same fixed batch, same weights and seeds. Worst tensors first.",
    "optimizer-step parity": "One step of the configured optimizer on each twin: parameters and optimizer state after it.",
    "state parity": "Buffers, plain Python attributes of modules, and the global RNG state after backward.",
    "warm-step memory": "What recomputation saves, and whether the saving is real: bytes autograd keeps for backward "
                        "(exact on any device, per wrapped module), CUDA allocator peaks where there is CUDA, and a "
                        "GPU-free estimate at the target shape.",
    "warm-step time": "What recomputation costs: warm training steps of both twins, interleaved; median, spread and a "
                      "95% confidence interval of the overhead, beside the FLOP bound of one extra forward.",
    "task metrics": "Gradient parity on one batch is necessary, not sufficient: the claim is about training. Both twins "
                    "are trained from the same initial weights on the same data order and seeds until each has accepted "
                    "the same number of examples, then evaluated on held-out data.",
    "larger-batch experiment": "The batch that the memory saving buys, trained by the recompute twin to the same "
                               "accepted-example budget.",
}


#: Rows shown per section in the report; the rest (all passing when the table is sorted worst
#: first and no more fail) are summarised in one line and stay in results.csv.
SHOWN_ROWS = 30


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


def environment() -> Environment:
    """The jinja2 environment: templates folder, autoescape, StrictUndefined, number filters."""
    env = Environment(loader=FileSystemLoader(str(templates_dir())), autoescape=select_autoescape(["html", "j2"]),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=fmt_num, bytes=fmt_bytes)
    return env


def _records(group: pd.DataFrame) -> list[dict]:
    """Rows of one check, worst status first, then largest value first."""
    order = {s: i for i, s in enumerate(SEVERITY)}
    group = group.assign(_sev=group.status.map(order), _val=pd.to_numeric(group.value, errors="coerce").fillna(-1))
    group = group.sort_values(["_sev", "_val"], ascending=[True, False], kind="stable")
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in group.drop(columns=["_sev", "_val"]).to_dict("records")]


def view_model(frame: pd.DataFrame, meta: dict, verdict: str, required: list[str]) -> dict:
    """What the templates read: metadata, verdict, per-check summary and sections."""
    summary = check_summary(frame, required)
    sections = []
    for check in summary.check:
        group = frame[frame.check == check]
        status = summary.loc[summary.check == check, "status"].iloc[0]
        anchor = check.replace(" ", "-")
        own = templates_dir() / "sections" / f"{anchor}.html.j2"
        not_passing = int(group.status.isin([FAIL, ERROR, NOT_RUN, WARN]).sum())
        sections.append({"check": check, "status": status, "intro": SECTION_INTRO.get(check, ""),
                         "rows": _records(group), "anchor": anchor, "shown": max(SHOWN_ROWS, not_passing),
                         "template": f"sections/{anchor}.html.j2" if own.exists() else "sections/rows.html.j2",
                         "plots": section_plots(check, group)})
    plain_failed = bool(((frame.status == ERROR) & (frame["item"] == "plain")).any())
    sections = guard_sections(environment(), sections)  # a missing value never stops the report (render_guard)
    return {"meta": meta, "verdict": verdict, "summary": summary.to_dict("records"), "sections": sections,
            "plain_failed": plain_failed, "costs": guard_costs(headline_costs, frame)}


def _value(frame: pd.DataFrame, check: str, item: str, variant: str, metric: str) -> pd.Series | None:
    hit = frame[(frame.check == check) & (frame["item"] == item) & (frame.variant == variant) & (frame.metric == metric)]
    return hit.iloc[0] if len(hit) else None


def headline_costs(frame: pd.DataFrame) -> dict:
    """Page-1 figures of the claim's cost, read from the frame: saved-activation bytes plain vs
    recompute (and the saving's share), and the step-time overhead ratio with its 95% CI.
    Missing measurements are ``None`` (the template says "not measured")."""
    plain = _value(frame, "warm-step memory", "saved activations (total)", "plain", "saved_activation_bytes")
    rec = _value(frame, "warm-step memory", "saved activations (total)", "recompute", "saved_activation_bytes")
    overhead = _value(frame, "warm-step time", "overhead", "recompute", "overhead_ratio")
    memory = None
    if plain is not None and rec is not None and plain.value > 0:
        memory = {"plain": plain.value, "recompute": rec.value, "saved": plain.value - rec.value,
                  "share": (plain.value - rec.value) / plain.value}
    time = None
    if overhead is not None and not pd.isna(overhead.value):
        time = {"ratio": overhead.value, "low": overhead.get("ci_low"), "high": overhead.get("ci_high"),
                "status": overhead.status}
    return {"memory": memory, "time": time}


#: PDF flavour of report.pdf: PDF/A-3b (ISO 19005-3, level B) is archival PDF that may carry
#: attached files (results.json, the signed statement) with a stated relationship.
PDF_VARIANT = "pdf/a-3b"


def write_pdf(html: str, created: str, attachments: list[tuple[str, bytes, str, str]] = ()) -> bytes:
    """Lay out ``html`` with WeasyPrint and return a PDF/A-3b file with ``attachments``.

    The bytes depend only on the arguments (and the installed fonts and WeasyPrint
    version): every date in the file (Info /CreationDate and /ModDate, XMP dates, each
    attachment's /Params dates) is ``created``, the trailer /ID is pydyf's MD5 of the
    objects, and font subset tags are MD5s of font descriptions. So with
    ``SOURCE_DATE_EPOCH`` fixed (which fixes ``created``, see ``metadata.report_time``),
    two renders of the same frame are byte-identical.

    Args:
        html: the rendered report.html.
        created: ISO 8601 time of the run, e.g. ``2024-01-01T00:00:00+00:00``.
        attachments: ``(file name, data, AFRelationship, description)`` per file; the
            relationship is a PDF/A-3 one: ``Data``, ``Source``, ``Supplement``, ...

    Returns:
        The PDF file, bytes.

    Raises:
        ValueError: ``created`` is not an ISO 8601 time.
    """
    from weasyprint import HTML, Attachment

    from .fetcher import LocalOnlyFetcher

    when = dt.datetime.fromisoformat(created).astimezone(dt.timezone.utc)
    fetcher = LocalOnlyFetcher([templates_dir()])  # no network, no file outside the report's own (item 11)
    document = HTML(string=html, base_url=str(templates_dir()), url_fetcher=fetcher).render(pdf_variant=PDF_VARIANT)
    document.metadata.created = document.metadata.modified = when.isoformat()
    files = [Attachment(file_obj=io.BytesIO(data), name=name, description=description, relationship=relationship,
                        created=when, modified=when) for name, data, relationship, description in attachments]
    return document.write_pdf(pdf_variant=PDF_VARIANT, attachments=files)


def render_html(frame: pd.DataFrame, meta: dict, verdict: str, required: list[str] | None = None) -> str:
    """report.html as text: the view model through ``templates/report.html.j2``."""
    return environment().get_template("report.html.j2").render(**view_model(frame, meta, verdict, list(required or [])))


def render_report(frame: pd.DataFrame, meta: dict, verdict: str, out_dir: Path, pdf: bool = True,
                  required: list[str] | None = None) -> dict[str, Path]:
    """Write report.html (and report.pdf, PDF/A-3b with results.json attached) into ``out_dir``.

    The PDF is unsigned here; ``signing.sign_run`` signs it afterwards when signing is on.
    With ``SOURCE_DATE_EPOCH`` fixed, the same frame and metadata give byte-identical files.

    Returns:
        ``{"html": path, "pdf": path}`` of what was written.

    Raises:
        FileExistsError: a report exists already in ``out_dir``.
    """
    html = render_html(frame, meta, verdict, required)
    paths = {"html": atomic_write(out_dir / "report.html", html)}
    if pdf:
        results = ("results.json", frame_to_json(frame).encode(), "Data",
                   "The results frame this report was rendered from (reportgen.results.frame_to_json).")
        paths["pdf"] = atomic_write(out_dir / "report.pdf", write_pdf(html, meta["created"], [results]))
    return paths
