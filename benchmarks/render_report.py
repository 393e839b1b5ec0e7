"""Rendering cost of a report: HTML (view model, plots, templates) and PDF (WeasyPrint), timed
side by side on one results frame, plus the page count and the size of results.json.

Usage (from the repository root)::

    .venv/bin/python benchmarks/render_report.py outputs/DATE/TIME        # a finished run folder
    .venv/bin/python benchmarks/render_report.py outputs/DATE/TIME --repeat 3

Prints one line per stage (median of ``--repeat`` renders, seconds) and the share of each.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

from pyhanko.pdf_utils.reader import PdfFileReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reportgen.checks import required_names
from reportgen.report.pdf import write_pdf
from reportgen.report.render import render_pages
from reportgen.results import claim_verdict, frame_from_json, frame_to_json


def _meta(run: Path) -> dict:
    """Metadata for rendering: the signed statement's predicate where there is one, else a stub."""
    meta = {
        "title": "Activation recomputation report",
        "created": "2026-01-01T00:00:00+00:00",
        "claim": {
            "model": "?",
            "task": "?",
            "mode": "?",
            "targets": [],
            "wrapped": [],
            "preserve_rng_state": True,
            "determinism_check": "default",
            "save_ops": [],
            "precision": "float32",
            "device": "cpu",
        },
        "tolerances": {"rtol": None, "atol": None, "source": "defaults"},
        "environment": {"reportgen": "bench"},
        "command": "",
        "config_yaml": "",
        "out_dir": str(run),
        "signature": "",
    }
    return meta


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    frame = frame_from_json((args.run / "results.json").read_text())
    required = required_names(None)
    verdict = claim_verdict(frame, required)
    meta = _meta(args.run)
    html_s, pdf_s = [], []
    for _ in range(args.repeat):
        start = time.perf_counter()
        html = render_pages(frame, meta, verdict, required)[1]
        html_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        pdf = write_pdf(html, meta["created"])
        pdf_s.append(time.perf_counter() - start)
    pages = len(PdfFileReader(io.BytesIO(pdf)).root["/Pages"]["/Kids"])
    html_m, pdf_m = statistics.median(html_s), statistics.median(pdf_s)
    print(
        json.dumps(
            {
                "rows": len(frame),
                "html_seconds": round(html_m, 3),
                "pdf_seconds": round(pdf_m, 3),
                "pdf_to_html_ratio": round(pdf_m / html_m, 2),
                "pages": pages,
                "pdf_bytes": len(pdf),
                "results_json_bytes": len(frame_to_json(frame)),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
