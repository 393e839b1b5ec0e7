"""Page 1 says plainly when recompute saves no memory or costs more (break-it finding 6: the handed
case relu_only keeps ~94 % more saved bytes under recompute, and page 1 had no word of it)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from conftest import run_pipeline, tiny_meta

from reportgen.checks import required_names
from reportgen.report.render import fmt_bytes, render_pages
from reportgen.results import Role, claim_verdict, frame_from_json

DATA = Path(__file__).resolve().parents[1] / "data"
BOX = 'class="costs-box"'


def page_one(frame, tmp_path) -> str:
    """The PDF's HTML up to the checks table: what page 1 shows before the sections."""
    required = required_names(None)
    _, pdf_html = render_pages(frame, tiny_meta(tmp_path), claim_verdict(frame, required), required)
    return pdf_html[: pdf_html.index("<h2>Checks</h2>")]


def real(name: str):
    with gzip.open(DATA / name, "rt") as f:
        return frame_from_json(f.read())


def test_a_real_saving_has_no_box(tmp_path):
    frame = real("mlp_passing_results.json.gz")  # saves 85.8 % of saved bytes; its step peak does not move
    assert BOX not in page_one(frame[frame.role != Role.PEAK_SAVING], tmp_path)


def test_an_unchanged_peak_is_said_on_page_one_with_its_figures(tmp_path):
    frame = real("mlp_failing_results.json.gz")  # saved bytes fall 85.8 %, the step peak does not move
    peak = frame[frame.role == Role.PEAK_SAVING].iloc[0]
    assert peak.value == 0.0
    html = " ".join(page_one(frame, tmp_path).split())
    box = html[html.index(BOX) :]
    assert "Memory: recompute saves no memory here." in box
    assert f"Step peak (live tensor bytes of a warm step) {fmt_bytes(peak.plain_peak_bytes)} → " in box
    assert "(unchanged, 0.0%)" in box and "Saved activations" not in box[: box.index("</div>")]


@pytest.mark.slow
def test_recomputing_only_the_relus_says_it_costs_memory_on_page_one(tmp_path):
    """tests/user_conf/model/peak_relu.yaml, the suite's own relu_only: every wrapped ReLU keeps its input."""
    code, frame = run_pipeline(tmp_path, "+model=peak_relu", "device=cpu", user_conf=True)
    saving = frame[frame.role == Role.SAVING].iloc[0]
    assert saving.value < -0.5  # recompute keeps more than half again what plain keeps
    html = (tmp_path / "report.html").read_text()
    first = " ".join(html[: html.index("<h2>Checks</h2>")].split())
    box = first[first.index(BOX) :]
    assert "Memory: recompute costs memory here." in box
    assert (
        f"Saved activations kept for backward {fmt_bytes(saving.plain_bytes)} → {fmt_bytes(saving.recompute_bytes)} "
        f"({-saving.value * 100:+.1f}%: {fmt_bytes(-saving.saving_bytes)} more than without recompute)"
    ) in box
    assert "saves -" not in first  # the cost row no longer says "saves -40.00 KiB"


def test_on_a_failing_page_one_the_evidence_comes_before_the_memory_box(tmp_path):
    """A claim that fails leads with why it fails; the memory box follows, still before the checks."""
    html = page_one(real("mlp_failing_results.json.gz"), tmp_path)
    assert html.index('class="verdict FAIL"') < html.index("<h3>Why it fails</h3>") < html.index(BOX)
    assert html.index(BOX) < html.index('<table class="claim">')
