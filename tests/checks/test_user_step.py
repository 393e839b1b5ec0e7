"""The task's own training step in every check that trains or times a step (issue 36, item 7): a task whose
step accumulates two micro-batches and clips (tests/user_models/counted_step.py) is what the memory, time,
task-metrics, larger-batch and single-process parity checks run, and page 1 says so. Each test fails when
its check runs reportgen's own one-forward step instead: then the user's members are never called."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch
from user_models.counted_step import CALLS

from reportgen.checks.base.run import Run
from reportgen.checks.budget import task_metrics
from reportgen.checks.larger_batch import larger_batch_experiment
from reportgen.checks.memory.check import warm_step_memory
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.checks.parity.step import step_and_state_parity
from reportgen.checks.timing.check import warm_step_time
from reportgen.results import Role, Status
from reportgen.twins.step import training_step

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
    rows = CHECKS[name](Run(counted))
    assert CALLS["forward_backward"] > 0, f"{name} did not run the task's forward_backward"
    assert (CALLS["before_step"] > 0) == (name in STEPPING), f"{name}: before_step calls {CALLS['before_step']}"
    assert not [r for r in rows if r.status in (Status.ERROR, Status.FAIL)]


def test_the_memory_check_says_whose_forwards_it_counted_and_tracks_two_micro_batches(counted):
    """Saved activations are counted over the user's two forwards; the step peak is measured although the model's
    root module runs twice in one step (torch's MemTracker raises on that; reportgen's tracker starts it again)."""
    rows = warm_step_memory(Run(counted))
    totals = [r for r in rows if r.role == Role.SAVED_TOTAL]
    assert totals and all("by the forwards of your forward_backward" in r.detail for r in totals)
    peaks = [r for r in rows if r.metric == "peak_live_bytes"]
    assert len(peaks) == 2 and all(r.value > 0 for r in peaks)
    assert not [r for r in rows if r.role == Role.EXCEPTION]


def test_page_one_says_the_users_step_ran_in_the_memory_time_and_task_metrics_checks(counted):
    said = counted.training_step.said()
    assert said.startswith("yours (forward_backward, before_step)")
    for check in ("warm-step memory and time", "task metrics", "larger batch", "gradient, optimizer-step"):
        assert check in said
    assert training_step(object.__new__(type("Bare", (), {}))).said().startswith("reportgen's in every check")


@pytest.mark.slow
def test_a_whole_run_with_the_users_step_holds_and_page_one_says_whose_step(tmp_path):
    from conftest import run_pipeline

    code, frame = run_pipeline(tmp_path, "+model=counted_step", user_conf=True)
    html = (tmp_path / "report.html").read_text()
    assert code == 0 and "training step: yours (forward_backward, before_step) in every check that trains" in html
    assert "the parity rows used rtol=" in html
    assert not frame[frame.status.isin([Status.ERROR, Status.FAIL])].shape[0]


@pytest.mark.slow
@pytest.mark.parametrize("fault", [False, True])
def test_a_step_drawing_from_the_tasks_own_generator_holds_and_a_real_fault_still_fails(tmp_path, fault):
    """Every twin starts from the task's generators as built (Setup.build) and the trajectory's twins each keep
    their own copy of that stream: without it the A/A controls of gradient and trajectory parity moved (exit 3)."""
    from conftest import run_pipeline

    extra = ["recompute.preserve_rng_state=false"] if fault else []
    code, frame = run_pipeline(tmp_path, "+model=permuting_step", *extra, user_conf=True)
    assert code == (1 if fault else 0), frame[frame.status != "PASS"][["check", "item", "status"]].to_string()
    if fault:  # the user's step runs a forward after a recomputing backward: the loss differing is not the cause
        why = frame[(frame.role == "diagnosis") & (frame.check == "gradient parity")].iloc[0]
        assert why.rule == "RNG not replayed", why.detail


@pytest.mark.parametrize(
    ("returned", "said"),
    [(None, "returned NoneType"), (torch.ones(4), "returned a tensor of shape [4]"), ({"loss": 1.0}, "returned dict")],
)
def test_a_step_that_returns_no_loss_is_named_with_its_fix(returned, said):
    task = SimpleNamespace(forward_backward=lambda model, batch: returned)
    with pytest.raises(
        TypeError, match=f"task.forward_backward\\(model, batch\\) {re.escape(said)}, not the step's loss"
    ):
        training_step(task).forward_backward(torch.nn.Linear(2, 2), (torch.ones(1, 2), torch.ones(1)))
    ok = SimpleNamespace(forward_backward=lambda model, batch: 2.5)
    assert training_step(ok).forward_backward(torch.nn.Linear(2, 2), (torch.ones(1, 2), torch.ones(1))).item() == 2.5


def test_a_make_optimizer_that_returns_no_optimizer_is_named_with_its_fix():
    task = SimpleNamespace(make_optimizer=lambda params: {"lr": 1e-3})
    with pytest.raises(TypeError, match="task.make_optimizer\\(params\\) returned dict, not a torch.optim.Optimizer"):
        training_step(task).make_optimizer(None, torch.nn.Linear(2, 2))


@pytest.mark.slow
def test_a_broken_user_step_breaks_the_plain_twin_so_the_claim_cannot_be_judged(tmp_path):
    """The plain twin raises in every check (its step returns no loss): exit 3, never a recompute FAIL (the time
    check's row names the plain twin, state parity says it did not run because of it), and the row names the fix."""
    from conftest import run_pipeline

    code, frame = run_pipeline(
        tmp_path, "+model=counted_step", "task.forward_backward=user_models.counted_step.no_loss", user_conf=True
    )
    assert code == 3
    broken = frame[frame.status.isin(["ERROR", "NOT_RUN"])]
    assert {"warm-step time", "state parity", "gradient parity", "task metrics"} <= set(broken.check)
    for _, rows in broken.groupby("check"):  # each check's first break is the plain twin's
        assert rows.twin.iloc[0] == "plain", broken[["check", "item", "twin"]].to_string()
    assert broken.detail.str.contains("returned NoneType, not the step's loss|step raised").all()


def test_a_step_that_leaves_the_model_in_eval_mode_is_refused_not_passed():
    """Dropout off in the user's step hides a dropout fault in recomputation (a PASS it did not earn)."""

    def evaluating(model, batch):
        model.eval()
        loss = model(batch[0]).square().mean()
        loss.backward()
        return loss.detach()

    model = torch.nn.Linear(2, 2).train()
    with pytest.raises(ValueError, match="left the model in eval mode"):
        training_step(SimpleNamespace(forward_backward=evaluating)).forward_backward(
            model, (torch.ones(1, 2), torch.ones(1))
        )


@pytest.mark.slow
@pytest.mark.parametrize("fault", [False, True])
def test_a_step_through_functional_call_holds_and_its_rng_fault_fails(tmp_path, fault):
    """A step that runs the model through ``torch.func.functional_call`` on computed weights (weight noise, MAML,
    functional SAM): the leaf guard watches the recompute twin's own parameters only, never the tensors swapped in
    for one forward (it refused them, on the plain twin too: exit 3), so the healthy step holds and a dropout mask
    not replayed still fails."""
    from conftest import run_pipeline

    extra = ["recompute.preserve_rng_state=false"] if fault else []
    code, frame = run_pipeline(tmp_path, "+model=functional_step", *extra, user_conf=True)
    assert code == (1 if fault else 0), frame[frame.status != "PASS"][["check", "item", "status"]].to_string()
    assert not (frame.detail.fillna("").str.contains("RecomputeHazard|grad_fn AddBackward0")).any()
