"""The check registry: one module plus one registry line makes a check that runs, renders,
judges and signs (issue 12); page-1 costs come from a real frame by role."""

from __future__ import annotations

import re

import pytest
from conftest import SMALL, compose_config, tiny_meta

from reportgen import checks
from reportgen.checks import Check, Section, default_required, flagged_names
from reportgen.checks.base.run import Run
from reportgen.checks.memory.check import warm_step_memory
from reportgen.checks.timing.check import warm_step_time
from reportgen.commands import run as pipeline
from reportgen.commands.run import prepare
from reportgen.config import GRADIENT_PARITY, LARGER_BATCH, MEMORY, STATE_PARITY, TIME
from reportgen.report.render import headline_costs, render_html
from reportgen.results import Role, Row, Status, frame_from_json, judge, to_frame

DUMMY = "dummy check"


def dummy_check(setup) -> list[Row]:
    """A check of the kind a contributor would add: measure, emit value + threshold + comparator."""
    within = {"comparator": "<=", "threshold_value": 0.5, "role": ""}  # threshold text: "<= 0.5"
    return [
        Row.measured(DUMMY, "answer", "abs_diff", 0.25, "", detail="close", **within),
        Row.measured(DUMMY, "question", "abs_diff", 2.0, "", detail="", on_miss=Status.WARN, **within),
    ]


def test_a_new_check_is_one_record_and_renders_judges_and_signs(monkeypatch, tmp_path, signing_key_pair):
    """One module (here: ``dummy_check`` + its record) and one registry line; nothing else is edited."""
    from reportgen.trust.keys import load_public_key
    from reportgen.verify import verify

    private, public = signing_key_pair
    record = Check(dummy_check, (Section(DUMMY, "A dummy check added in a test."),))
    monkeypatch.setattr(checks, "REGISTRY", [*checks.REGISTRY[:1], record])
    monkeypatch.setattr(pipeline, "REGISTRY", checks.REGISTRY)
    assert DUMMY in default_required()
    cfg = compose_config("+model=ffn", *SMALL, "report.pdf=true", "report.sign=true", f"report.key_path={private}")
    code = pipeline.run(cfg, tmp_path)
    frame = frame_from_json((tmp_path / "results.json").read_text())
    dummy = frame[frame.check == DUMMY].set_index("item").status.to_dict()
    assert dummy == {"answer": Status.PASS, "question": Status.WARN}  # judged by results.judge, not by the check
    html = (tmp_path / "report.html").read_text()
    assert 'id="dummy-check"' in html and "A dummy check added in a test." in html
    assert code == 0 and (tmp_path / "report.pdf").is_file()
    lines = verify(tmp_path, load_public_key(public))  # signed, and re-judged by the verifier
    assert [c.detail for c in lines if c.status == "FAIL"] == [] and any(
        "dummy" in c.detail or c.name == "verdict" for c in lines
    )


@pytest.mark.parametrize(
    "value, comparator, threshold, on_miss, expected",
    [
        (1.0, "<=", 1.0, Status.FAIL, Status.PASS),
        (1.0001, "<=", 1.0, Status.FAIL, Status.FAIL),
        (0.5, ">=", 0.05, Status.WARN, Status.PASS),
        (0.01, ">=", 0.05, Status.WARN, Status.WARN),
        (float("nan"), "<=", 1.0, Status.FAIL, Status.FAIL),
        (0.0, "==", 0.0, Status.FAIL, Status.PASS),
        (1.0, "<=", float("nan"), Status.FAIL, Status.FAIL),
    ],
)
def test_judge_compares_value_with_threshold(value, comparator, threshold, on_miss, expected):
    assert judge(value, comparator, threshold, on_miss) == expected


def test_judge_allclose_and_confidence_interval_rules():
    assert judge(0.3, "allclose", float("nan"), excess=-1e-9) == Status.PASS
    assert judge(0.3, "allclose", float("nan"), excess=1e-9) == Status.FAIL
    assert judge(0.0, "allclose", float("nan"), excess=float("nan")) == Status.FAIL
    assert judge(1.10, "ci<=", 1.2, ci_high=1.15) == Status.PASS
    assert judge(1.10, "ci<=", 1.2, ci_high=1.25) == Status.WARN
    assert judge(1.25, "ci<=", 1.2, ci_high=1.30) == Status.FAIL
    with pytest.raises(ValueError, match="unknown comparator"):
        judge(1.0, "~", 1.0)


def test_a_row_states_no_pass_or_fail_of_its_own():
    named = dict(check=DUMMY, item="x", variant="recompute", metric="abs_diff", value=3.0)
    row = Row(**named, comparator="<=", threshold_value=1.0, status=Status.PASS)
    assert row.status == Status.FAIL


def test_registry_defaults():
    assert default_required() == [
        GRADIENT_PARITY,
        "optimizer-step parity",
        STATE_PARITY,
        "trajectory parity",
        MEMORY,
        TIME,
        "task metrics",
    ]
    assert flagged_names() == {LARGER_BATCH}


def test_page_one_costs_come_from_a_real_frame():
    setup = prepare(compose_config("+model=ffn", *SMALL))
    frame = to_frame(warm_step_memory(Run(setup)) + warm_step_time(Run(setup)))
    costs = headline_costs(frame)
    saving = frame[frame.role == Role.SAVING].iloc[0]
    totals = frame[frame.role == Role.SAVED_TOTAL].set_index("variant").value
    assert costs["memory"]["plain"] == totals["plain"] > costs["memory"]["recompute"] == totals["recompute"]
    assert costs["memory"]["share"] == saving.value == pytest.approx(1 - totals["recompute"] / totals["plain"])
    overhead = frame[frame.role == Role.OVERHEAD].iloc[0]
    assert costs["time"]["ratio"] == overhead.value and costs["time"]["low"] == overhead.ci_low
    html = render_html(frame, tiny_meta("/tmp/x"), Status.PASS, [MEMORY, TIME])
    page_one = html[: html.index("<h2>Checks</h2>")]
    assert f", {costs['memory']['share'] * 100:.1f}%)" in page_one
    assert re.search(rf"step time ×{overhead.value:.3f}", page_one)
    assert "not measured" not in page_one
    peak = frame[frame.role == Role.PEAK_SAVING].iloc[0]
    peaks = frame[frame.role == Role.STEP_PEAK].set_index("variant").value
    assert costs["peak"]["plain"] == peaks["plain"] and costs["peak"]["recompute"] == peaks["recompute"]
    assert costs["peak"]["share"] == peak.value and costs["peak"]["status"] == peak.status
    assert "step peak " in page_one and "step peak not measured" not in page_one
