"""Cannot be judged is not a failure (issue 28 item 6): a plain twin that breaks is an ERROR of the
baseline, the check cannot be judged and the run is INCONCLUSIVE (exit 3); the recompute twin raising
where the plain twin does not stays a FAIL. Fixture: tests/user_models/recompute_faults.py HookingBlock."""

from __future__ import annotations

import pytest
from conftest import run_pipeline

from reportgen.results import BASELINE, Status, check_summary, claim_verdict


def page_one(tmp_path) -> str:
    html = (tmp_path / "report.html").read_text()
    return html[: html.index("<h2>Checks</h2>")]


@pytest.mark.slow
def test_a_forward_that_hooks_unconditionally_cannot_be_judged_exit_3(tmp_path):
    code, frame = run_pipeline(tmp_path, "+model=hook_always", user_conf=True)
    assert code == 3
    broken = frame[(frame.check == "task metrics") & (frame.twin == BASELINE)]
    assert set(broken.status) == {Status.ERROR} and broken.detail.str.contains("cannot register a hook").all()
    summary = check_summary(frame, ["task metrics"]).set_index("check").status
    assert summary["task metrics"] == Status.INCONCLUSIVE and summary["gradient parity"] == "PASS"
    page = page_one(tmp_path)
    assert "CANNOT BE JUDGED" in page and "Why it cannot be judged" in page
    assert "the plain twin broke: the plain training run raised RuntimeError: cannot register a hook" in page
    assert "Claim FAILS" not in page


@pytest.mark.slow
def test_the_same_model_under_reentrant_recompute_still_fails(tmp_path):
    code, frame = run_pipeline(tmp_path, "+model=hook_always", "recompute=reentrant", user_conf=True)
    assert code == 1
    parity = frame[(frame.check == "gradient parity") & (frame.status == Status.ERROR)]
    assert set(parity["item"]) == {"recompute"} and (parity.twin == "recompute").all()
    assert claim_verdict(frame, ["gradient parity", "task metrics"]) == "FAIL"
    assert claim_verdict(frame, ["task metrics"]) == Status.INCONCLUSIVE  # alone, task metrics only lacks its baseline
    page = page_one(tmp_path)
    assert "Why it fails" in page and page.index("gradient parity") < page.index("the plain twin broke")
