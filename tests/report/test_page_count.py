"""A passing mlp report has the same pages whether the timing was quiet or noisy (issue 19, item 5).

The frame is a real passing ``+model=mlp`` run, detector controls included (tests/data/mlp_passing_results.json.gz,
its warm-step time rows removed), with warm-step time rows made by the timing check's own row
functions from quiet or noisy step times. On a busy machine the noisy rows used to add
sentences to the timing section, and a ninth page.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_meta
from rows import fact_row

from reportgen.checks import required_names
from reportgen.checks.timing import rows as timing
from reportgen.config import CONTROLS, TIME
from reportgen.paths import templates_dir
from reportgen.report.render import render_pages
from reportgen.results import Role, Row, Status, claim_verdict, frame_from_json, to_frame

DATA = Path(__file__).resolve().parents[1] / "data" / "mlp_passing_results.json.gz"
#: A real failing ``+model=mlp recompute.preserve_rng_state=false`` run (issue 28 item 8): five required
#: checks fail, 27 of 36 gradients among them.
FAILING = Path(__file__).resolve().parents[1] / "data" / "mlp_failing_results.json.gz"
MAX_PAGES = 8
MAX_FAILING_PAGES = 12


def timing_rows(noisy: bool, monkeypatch) -> list[Row]:
    """The warm-step time rows of a quiet run (40 tight rounds) or a noisy one (200 rounds spread
    over two orders of magnitude, a load average of 6.5 on the CPUs)."""
    rng = np.random.default_rng(0)
    rounds = 200 if noisy else 40
    plain = 16 + (rng.exponential(40, rounds) if noisy else rng.normal(0, 0.05, rounds))
    recompute = plain * 1.25 * (1 + (rng.normal(0, 0.3, rounds) if noisy else rng.normal(0, 0.002, rounds)))
    times = {"plain": list(np.abs(plain)), "recompute": list(np.abs(recompute))}
    stopped = "time budget of 10 s spent" if noisy else "confidence target reached"
    rows = [
        fact_row(TIME, f"step {k}", "step_time_ms", ms, variant=v, role=Role.STEP, unit="ms", extra={"step_index": k})
        for v in timing.VARIANTS
        for k, ms in enumerate(times[v])
    ]
    rows += timing.median_rows(times, None, 10.0)
    overhead = timing.overhead_row(times, 2000, None)
    overhead.extra.update({"rounds": rounds, "stopped": stopped, "target_ci_half_width_pp": 2.0})
    rows += [
        overhead,
        timing.ci_width_row(overhead, 2.0, stopped),
        timing.flops_row({"plain": 10**6, "recompute": 13 * 10**5}),
    ]
    monkeypatch.setattr(os, "getloadavg", lambda: (6.5 if noisy else 0.2, 0.0, 0.0))  # wherever the row reads it
    return rows + [timing.machine_load_row()]


def mlp_frame(noisy: bool, monkeypatch, data: Path = DATA) -> pd.DataFrame:
    with gzip.open(data, "rt") as f:
        base = frame_from_json(f.read())
    base = base[base.check != TIME]  # the timing rows of this machine's load replace the recorded ones
    return pd.concat([base, to_frame(timing_rows(noisy, monkeypatch))], ignore_index=True)


def layout(frame: pd.DataFrame, tmp_path: Path):
    """The PDF's pages as WeasyPrint lays them out, and ``{section id: (page, y)}`` of each section's
    top (sections without an id, such as "Environment and reproduction", by their position)."""
    from weasyprint import HTML

    required = required_names(None)
    _, pdf_html = render_pages(frame, tiny_meta(tmp_path), claim_verdict(frame, required), required)
    document = HTML(string=pdf_html, base_url=str(templates_dir())).render()
    tops, seen = {}, set()
    for number, page in enumerate(document.pages):
        for box in page._page_box.descendants():
            element = getattr(box, "element", None)
            if (
                element is None
                or element.tag != "div"
                or "section" not in (element.get("class") or "").split()
                or id(element) in seen
            ):
                continue
            seen.add(id(element))  # the first box of a section (it may continue on the next page)
            tops[element.get("id") or f"section {len(tops)}"] = (number, round(box.position_y, 1))
    return document.pages, tops


@pytest.mark.slow
def test_noisy_timing_adds_no_page_and_moves_nothing(tmp_path, monkeypatch):
    quiet, noisy = mlp_frame(False, monkeypatch), mlp_frame(True, monkeypatch)
    statuses = lambda f: set(f[f.role.isin([Role.OVERHEAD_CI, Role.LOAD])].status)
    assert statuses(quiet) == {Status.PASS} and statuses(noisy) == {Status.WARN}  # the two frames really differ
    assert claim_verdict(noisy, required_names(None)) == Status.PASS
    assert set(quiet[quiet.check == CONTROLS].status) == {Status.PASS, Status.INFO}  # the controls' page share too
    quiet_pages, quiet_tops = layout(quiet, tmp_path)
    noisy_pages, noisy_tops = layout(noisy, tmp_path)
    assert len(quiet_pages) <= MAX_PAGES and len(noisy_pages) == len(quiet_pages)
    # every section after the timing one starts where it did on the quiet machine: the noisy
    # detail takes the same one line as the passing one
    assert list(noisy_tops) == list(quiet_tops)
    moved = {
        name: (quiet_tops[name], top)
        for name, top in noisy_tops.items()
        if top[0] != quiet_tops[name][0] or abs(top[1] - quiet_tops[name][1]) > 1.0
    }
    assert moved == {}  # before the fix the section after timing moved down 124 px (about 6 lines)
    assert list(quiet_tops).index("warm-step-time") < len(quiet_tops) - 1  # a section follows it, so growth would show


def page_text(page) -> str:
    """Every word laid out on one page, joined by spaces."""
    return " ".join(b.text for b in page._page_box.descendants() if hasattr(b, "text") and b.text).replace("\u200b", "")


@pytest.mark.slow
def test_a_failing_report_fits_twelve_pages_with_every_failing_checks_evidence_on_page_one(tmp_path, monkeypatch):
    from reportgen.report.evidence import lead_evidence

    frame = mlp_frame(True, monkeypatch, FAILING)  # noisy timing: the worst case of a loaded machine
    required = required_names(None)
    assert claim_verdict(frame, required) == "FAIL"
    pages, _ = layout(frame, tmp_path)
    assert len(pages) <= MAX_FAILING_PAGES
    lead = lead_evidence(frame, required)
    failing = [
        c for c in dict.fromkeys(frame.check) if c in required and (frame[frame.check == c].status == "FAIL").any()
    ]
    assert [e["check"] for e in lead] == failing and len(failing) == 5
    first = page_text(pages[0]).replace(" ", "")
    for entry in lead:  # each failing check, its worst item and how many of its items fail, on page 1
        assert entry["check"].replace(" ", "") in first
        assert entry["item"].replace(" ", "") in first, entry["item"]
        assert f"{entry['failing']}of{entry['judged']}" in first
    grads = frame[(frame.check == "gradient parity") & (frame.status == "FAIL")]
    assert lead[0]["item"] == grads.loc[grads.tolerance_used.idxmax(), "item"]  # the worst, not the first


@pytest.mark.slow
def test_a_failing_unsigned_report_says_unsigned_on_page_one(tmp_path, monkeypatch):
    """The failing report's "Why it fails" table fills page 1: the UNSIGNED mark stands beside the verdict,
    not only in the claim table that the long evidence pushes to page 2; a signed report has no banner."""
    frame = mlp_frame(True, monkeypatch, FAILING)
    pages, _ = layout(frame, tmp_path)
    first = page_text(pages[0])
    assert "UNSIGNED" in first and "report.sign=false" in first
    assert "Memory: recompute saves no memory here." in first  # the step peak does not move (finding 6)
    required = required_names(None)
    signed = tiny_meta(tmp_path, "sha256:" + "ab" * 32)
    _, pdf_html = render_pages(frame, signed, claim_verdict(frame, required), required)
    assert ">UNSIGNED<" not in pdf_html and 'class="unsigned-banner"' not in pdf_html
