"""Reproducible bytes (issue 5): with SOURCE_DATE_EPOCH fixed, the same results give
byte-identical unsigned report.html and report.pdf, whatever the wall clock says."""

from __future__ import annotations

import io
import time
from pathlib import Path

from conftest import REQUIRED, tiny_frame, tiny_meta

from reportgen.report.metadata import report_time
from reportgen.report.render import render_report
from reportgen.results import claim_verdict, frame_to_json

EPOCH = "1704164645"  # 2024-01-02T03:04:05Z


def render(out_dir: Path, monkeypatch, clock_shift_s: float = 0.0, created: str | None = None) -> tuple[bytes, bytes]:
    """Render the tiny frame into ``out_dir`` as ``run`` would (time from ``report_time`` unless
    ``created``), with the wall clock moved by ``clock_shift_s`` s while rendering; returns (html, pdf)."""
    frame = tiny_frame()
    out_dir.mkdir()
    meta = tiny_meta(Path("/runs/same-folder")) | {"created": created or report_time()}
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + clock_shift_s)
    try:
        render_report(frame, meta, claim_verdict(frame, REQUIRED), out_dir, required=REQUIRED)
    finally:
        monkeypatch.setattr(time, "time", real)
    return (out_dir / "report.html").read_bytes(), (out_dir / "report.pdf").read_bytes()


def test_two_renders_with_fixed_source_date_epoch_are_byte_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    html_a, pdf_a = render(tmp_path / "a", monkeypatch)
    html_b, pdf_b = render(tmp_path / "b", monkeypatch, clock_shift_s=86_400)  # a day later by the clock
    assert html_a == html_b
    assert pdf_a == pdf_b


def test_control_another_run_time_gives_other_bytes(tmp_path, monkeypatch):
    """Shows the test above can fail: the run time is in the PDF's dates, so another one changes
    the bytes. (Without SOURCE_DATE_EPOCH, WeasyPrint's fontTools subsetter also stamps the
    clock into the fonts; with HarfBuzz's subsetter it does not.)"""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    _, pdf_a = render(tmp_path / "a", monkeypatch, created="2024-01-02T03:04:05+00:00")
    _, pdf_b = render(tmp_path / "b", monkeypatch, created="2024-01-03T03:04:05+00:00")
    assert pdf_a != pdf_b


def test_unsigned_pdf_is_pdf_a_3b_with_fixed_dates_and_results_attached(tmp_path, monkeypatch):
    from pyhanko.pdf_utils.reader import PdfFileReader

    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    _, pdf = render(tmp_path / "a", monkeypatch)
    assert pdf.startswith(b"%PDF-1.7")
    reader = PdfFileReader(io.BytesIO(pdf))
    xmp = reader.root["/Metadata"].data
    assert b'pdfaid:part="3"' in xmp and b'pdfaid:conformance="B"' in xmp
    assert b"2024-01-02T03:04:05" in xmp
    assert str(reader.trailer["/Info"]["/CreationDate"]).startswith("D:20240102030405")
    names = reader.root["/Names"]["/EmbeddedFiles"]["/Names"]
    assert len(names) == 2 and str(names[0]) == "results.json"
    spec = names[1]
    assert str(spec["/AFRelationship"]) == "/Data"
    assert spec["/EF"]["/F"].data == frame_to_json(tiny_frame()).encode()
    assert str(spec["/EF"]["/F"]["/Params"]["/ModDate"]).startswith("D:20240102030405")
