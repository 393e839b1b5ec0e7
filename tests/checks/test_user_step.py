"""The task's own training step in every check that trains or times a step (issue 36, item 7): a task whose
step accumulates two micro-batches and clips (tests/user_models/counted_step.py) is what the memory, time,
task-metrics, larger-batch and single-process parity checks run, and page 1 says so. Each test fails when
its check runs reportgen's own one-forward step instead: then the user's members are never called."""

from __future__ import annotations

import pytest
from user_models.counted_step import CALLS

from reportgen.checks.budget import task_metrics
from reportgen.checks.larger_batch import larger_batch_experiment
from reportgen.checks.memory.check import warm_step_memory
from reportgen.checks.parity import gradient_parity
from reportgen.checks.step import step_and_state_parity
from reportgen.checks.timing.check import warm_step_time
from reportgen.results import Role, Status
from reportgen.twins.user_step import step_said

CHECKS = {
    "warm-step memory": warm_step_memory,
    "warm-step time": warm_step_time,
    "task metrics": task_metrics,
    "larger batch": larger_batch_experiment,
    "gradient parity": gradient_parity,
    "optimizer-step parity": step_and_state_parity,
}
#: The checks that take an optimizer step, so they call ``before_step`` too (gradient parity stops at backward).
STEPPING = set(CHECKS) - {"gradient parity"}


@pytest.fixture(scope="module")
def counted(request):
    """The counted-step task's Setup (small budgets)."""
    from conftest import small_setup

    return small_setup("+model=counted_step", user_conf=True)


@pytest.mark.parametrize("name", list(CHECKS))
def test_each_check_runs_the_users_step(counted, name):
    CALLS.clear()
    rows = CHECKS[name](counted)
    assert CALLS["forward_backward"] > 0, f"{name} did not run the task's forward_backward"
    assert (CALLS["before_step"] > 0) == (name in STEPPING), f"{name}: before_step calls {CALLS['before_step']}"
    assert not [r for r in rows if r.status in (Status.ERROR, Status.FAIL)]


def test_the_memory_check_says_whose_forwards_it_counted_and_tracks_two_micro_batches(counted):
    """Saved activations are counted over the user's two forwards; the step peak is measured although the model's
    root module runs twice in one step (torch's MemTracker raises on that; reportgen's tracker starts it again)."""
    rows = warm_step_memory(counted)
    totals = [r for r in rows if r.role == Role.SAVED_TOTAL]
    assert totals and all("by the forwards of your forward_backward" in r.detail for r in totals)
    peaks = [r for r in rows if r.metric == "peak_live_bytes"]
    assert len(peaks) == 2 and all(r.value > 0 for r in peaks)
    assert not [r for r in rows if r.role == Role.EXCEPTION]


def test_page_one_says_the_users_step_ran_in_the_memory_time_and_task_metrics_checks(counted):
    said = step_said(counted.task)
    assert said.startswith("yours (forward_backward, before_step)")
    for check in ("warm-step memory and time", "task metrics", "larger batch", "gradient, optimizer-step"):
        assert check in said
    assert step_said(object.__new__(type("Bare", (), {}))).startswith("reportgen's in every check")


@pytest.mark.slow
def test_a_whole_run_with_the_users_step_holds_and_page_one_says_whose_step(tmp_path):
    from conftest import run_pipeline

    code, frame = run_pipeline(tmp_path, "+model=counted_step", user_conf=True)
    html = (tmp_path / "report.html").read_text()
    assert code == 0 and "training step: yours (forward_backward, before_step) in every check that trains" in html
    assert "the parity rows used rtol=" in html
    assert not frame[frame.status.isin([Status.ERROR, Status.FAIL])].shape[0]
