"""Rounding is not a fault (issue 16, item 4): the rounding twin's envelope passes differences
that tolerance-sized gradient noise also makes, and never swallows a real fault.

Fixtures: tests/user_models/rounding.py (healthy, differs at rounding level only) and the
held faults of tests/user_models/faults.py and truth.py (no ../shared needed)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import small_setup

from reportgen.checks.base.run import Run
from reportgen.checks.budget import compare_seed
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.checks.parity.step import step_and_state_parity
from reportgen.checks.parity.trajectory import trajectory_parity
from reportgen.results import Role, Status, judge, judge_record, to_frame
from reportgen.results.compared import tensor_row
from reportgen.results.rounding import GradientNudge, envelope, grads_at_rounding_level
from reportgen.results.rows import ROUNDING_LEVEL, envelope_used, with_rounding
from reportgen.training.loop import TrainResult


def test_nudge_moves_every_element_by_exactly_the_gradient_tolerance_with_reproducible_signs():
    grads = torch.tensor([0.0, 1.0, -2.0, 1e-9, 4.0, -8.0, 0.5, 3.0])
    runs = []
    for _ in range(2):
        p = torch.nn.Parameter(torch.zeros(8))
        p.grad = grads.clone()
        GradientNudge(1e-3, 1e-5, seed=0)([p])
        runs.append(p.grad)
    delta = (runs[0] - grads).double()
    assert torch.allclose(delta.abs(), 1e-5 + 1e-3 * grads.double().abs(), rtol=0, atol=1e-6)  # float32 sums
    assert torch.equal(runs[0], runs[1])  # the same signs from the same seed
    assert (delta > 0).any() and (delta < 0).any()  # random signs, not a shift


def test_nudge_defaults_to_the_dtype_tolerance_and_leaves_missing_gradients_alone():
    p, q = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    p.grad = torch.zeros(3)
    GradientNudge(None, None, seed=1)([p, q])
    assert torch.allclose(p.grad.abs(), torch.full((3,), 1e-5))  # float32 atol of assert_close
    assert q.grad is None


def test_judge_passes_a_row_outside_tolerance_only_within_its_rounding_envelope():
    assert judge(1.0, "allclose", math.nan, excess=0.5, rounding_excess=-0.1) == Status.PASS
    assert judge(1.0, "allclose", math.nan, excess=0.5, rounding_excess=0.1) == Status.FAIL
    assert judge(1.0, "allclose", math.nan, excess=0.5, rounding_excess=math.nan) == Status.FAIL
    assert judge(2.0, "<=", 1.0, rounding_excess=-1.0) == Status.PASS
    assert judge(2.0, ">=", 3.0, rounding_excess=-1.0) == Status.FAIL  # only allclose and <= read it
    record = {"value": 1.0, "comparator": "allclose", "excess": 0.5, "rounding_excess": -0.1, "on_miss": Status.FAIL}
    assert judge_record(record) == Status.PASS  # what reportgen.verify recomputes


def test_with_rounding_passes_inside_twice_the_envelope_and_fails_outside():
    plain = torch.zeros(4)
    recompute = torch.tensor([0.0, 3e-4, 0.0, 0.0])
    inside = with_rounding(tensor_row("c", "w", plain, recompute, None, None, Role.PARAM), 2e-4, 2.0)
    outside = with_rounding(tensor_row("c", "w", plain, recompute, None, None, Role.PARAM), 1e-4, 2.0)
    assert inside.status == Status.PASS and ROUNDING_LEVEL in inside.detail
    assert inside.extra["rounding_excess"] == pytest.approx(3e-4 - 4e-4)
    assert outside.status == Status.FAIL and "outside 2× the rounding envelope" in outside.detail
    assert "uses 0.75 of its 2× rounding envelope" in inside.detail  # 3e-4 of the 4e-4 allowed
    assert envelope_used(3e-4, 2e-4, 2.0) == pytest.approx(0.75) and envelope_used(1e-9, 0.0, 2.0) == math.inf


def test_envelope_skips_integer_tensors_and_the_gradient_gate_uses_it_after_the_first_step():
    plain = {"w": torch.zeros(2), "n": torch.tensor(3)}
    assert envelope(plain, {"w": torch.tensor([0.0, 0.5]), "n": torch.tensor(4)}) == {"w": 0.5}
    recompute = {"w": torch.tensor([0.0, 0.1]), "n": torch.tensor(3)}
    assert not grads_at_rounding_level(plain, recompute, None, None, None, 2.0)  # 0.1 > tolerance, no envelope
    assert grads_at_rounding_level(
        plain, recompute, {"w": torch.tensor([0.0, 0.06]), "n": torch.tensor(3)}, None, None, 2.0
    )
    assert not grads_at_rounding_level({"w": None}, {"w": torch.zeros(1)}, None, None, None, 2.0)


def _rows(setup):
    return to_frame(gradient_parity(Run(setup)) + step_and_state_parity(Run(setup)) + trajectory_parity(Run(setup)))


def _checks(frame):
    return {c: sorted(set(g.status)) for c, g in frame.groupby("check", sort=False)}


def test_rounding_level_model_passes_step_and_trajectory_with_the_envelope_and_fails_without():
    on = _rows(small_setup("+model=rounding_level", user_conf=True))
    grads = on[on.role == Role.PARAM_GRAD]
    assert grads.status.eq(Status.PASS).all() and grads.value.max() > 0  # rounding-level gradient differences
    shift = on[(on.check == "optimizer-step parity") & (on["item"] == "param 3.shift")].iloc[0]
    assert shift.excess > 0 and shift.status == Status.PASS and ROUNDING_LEVEL in shift.detail
    assert 0 < shift.value <= 2 * shift.rounding_envelope
    steps = on[(on.role == Role.TRAJECTORY) & (on.variant == "recompute")]
    assert (
        steps.status.eq(Status.PASS).all()
        and (steps.excess > 0).all()
        and steps.detail.str.contains(ROUNDING_LEVEL).all()
    )
    assert set(_checks(on)["optimizer-step parity"]) == {Status.PASS}

    off = _rows(small_setup("+model=rounding_level", "parity.rounding_envelope=false", user_conf=True))
    status = _checks(off)
    assert Status.FAIL in status["optimizer-step parity"] and Status.FAIL in status["trajectory parity"]
    assert "rounding_envelope" not in off.columns  # off means not built at all


def test_rounding_level_model_passes_task_metrics_and_fails_them_without_the_envelope(tmp_path):
    from reportgen.checks.budget import task_metrics

    for flag, expected in (("true", Status.PASS), ("false", Status.FAIL)):
        frame = to_frame(
            task_metrics(Run(small_setup("+model=rounding_level", f"parity.rounding_envelope={flag}", user_conf=True)))
        )
        final = frame[frame.role == Role.FINAL_PARAMS].iloc[0]
        assert final.excess > 0 and final.status == expected, final.detail
    assert ROUNDING_LEVEL in final.detail or "trained apart" in final.detail


def test_the_rounding_twin_is_not_built_when_everything_is_within_tolerance(monkeypatch):
    built = []
    monkeypatch.setattr(GradientNudge, "__call__", lambda self, params: built.append(1))
    frame = _rows(small_setup("+model=dropout_rng", "recompute.preserve_rng_state=true", user_conf=True))
    assert set(frame.status) <= {Status.PASS, "INFO"} and built == []


@pytest.mark.parametrize(
    "model, check",
    [("observer", "trajectory parity"), ("batchnorm_stats", "state parity"), ("forward_counter", "state parity")],
)
def test_held_faults_still_fail_with_the_envelope_on(model, check):
    """Only the check whose FAIL is asserted runs (step parity writes state parity's rows too)."""
    run = {"trajectory parity": trajectory_parity, "state parity": step_and_state_parity}[check]
    frame = to_frame(run(Run(small_setup(f"+model={model}", "parity.rounding_envelope=true", user_conf=True))))
    assert Status.FAIL in _checks(frame)[check]


def test_dropout_not_replayed_keeps_its_step_failure_although_the_envelope_would_cover_it():
    """Its gradients differ beyond tolerance, so the envelope (a model of gradient noise) never applies."""
    frame = _rows(small_setup("+model=dropout_rng", "recompute.preserve_rng_state=false", user_conf=True))
    assert Status.FAIL in _checks(frame)["optimizer-step parity"]
    assert "rounding_envelope" not in frame.columns or frame.rounding_envelope.isna().all()


def _result(metric: float, params: dict) -> TrainResult:
    return TrainResult({"loss": metric}, 8, 1, 0, 0, final_params=params)


def test_a_metric_difference_with_parameters_within_tolerance_is_never_put_down_to_rounding(monkeypatch):
    """BatchNorm statistics updated twice: weights equal, held-out loss apart. No rounding twin is
    trained (it could not explain a difference the weights do not hold)."""
    import reportgen.checks.budget as budget

    monkeypatch.setattr(budget, "rounding_run", lambda *a, **k: pytest.fail("rounding twin built"))
    setup = small_setup("+model=rounding_level", user_conf=True)
    w = {"w": torch.ones(3)}
    rows, _ = compare_seed(Run(setup), 0, 8, {"plain": _result(2.0, w), "recompute": _result(2.001, dict(w))})
    assert [r.status for r in rows] == [Status.FAIL, Status.PASS]


def test_worst_seed_row_follows_the_rounding_verdict_of_its_seed(monkeypatch):
    import reportgen.checks.budget as budget

    setup = small_setup("+model=rounding_level", user_conf=True)
    plain = _result(2.0, {"w": torch.zeros(3)})
    recompute = _result(2.001, {"w": torch.tensor([0.0, 1e-3, 0.0])})
    for rounding_w, expected in ((2e-3, Status.PASS), (1e-4, Status.FAIL)):
        rounding = _result(2.002, {"w": torch.tensor([0.0, rounding_w, 0.0])})
        monkeypatch.setattr(budget, "rounding_run", lambda *a, r=rounding, **k: r)
        rows, diff = compare_seed(Run(setup), 0, 8, {"plain": plain, "recompute": recompute})
        final = next(r for r in rows if r.role == Role.FINAL_PARAMS)
        assert final.status == expected and rows[0].status == expected  # metric: 0.001 <= 2 × 0.002, if weights are
        assert diff[3] == (pytest.approx(0.001 - 2 * 0.002) if expected == Status.PASS else None)  # at rounding level


@pytest.mark.hf
def test_tiny_t5_under_its_own_reentrant_switch_trains_apart_at_rounding_level_only():
    """The issue's second case, small: gradients within tolerance but not bitwise, the trained
    weights beyond tolerance after the budget; the envelope passes them, without it they FAIL.

    The fixture's learning rate keeps training out of saturation (tests/user_conf/model/t5_reentrant.yaml):
    measured across CPU kernels (ATen AVX512/AVX2/default, MKL AVX2/SSE4.2, 1-4 threads) and six
    rounding-twin sign seeds, the worst parameter uses 0.008-0.06 of its 2× envelope, the metric at
    most 0.41; the bound asserted here (0.5) leaves that margin eight times over for the parameters."""
    pytest.importorskip("transformers")
    from reportgen.checks.budget import task_metrics

    budget = ("budget.examples=512", "budget.batch_size=16")
    setup = small_setup("+model=t5_reentrant", *budget, user_conf=True)
    grads = to_frame(gradient_parity(Run(setup)))
    grads = grads[grads.role == Role.PARAM_GRAD]
    assert grads.status.eq(Status.PASS).all() and grads.value.max() > 0
    for flag, expected in (("true", Status.PASS), ("false", Status.FAIL)):
        flagged = (  # the envelope is on by default: the setup above, as the pipeline runs every check on one
            setup
            if flag == "true"
            else small_setup("+model=t5_reentrant", *budget, f"parity.rounding_envelope={flag}", user_conf=True)
        )
        assert flagged.config.parity.rounding_envelope == (flag == "true")
        frame = to_frame(task_metrics(Run(flagged)))
        final = frame[frame.role == Role.FINAL_PARAMS].iloc[0]
        assert final.excess > 0 and final.status == expected, final.detail
        metric = frame[frame.role.isin([Role.METRIC_DIFF, Role.WORST])]
        if expected == Status.PASS:
            assert set(metric.status) == {Status.PASS}, metric.detail.tolist()
            used = float(re.search(r"the closest uses ([0-9.]+) of its 2× rounding envelope", final.detail).group(1))
            assert 0 < used <= 0.5, final.detail  # measured 0.008-0.06: the margin, not the factor, passes it
        else:  # without the envelope the metric rows follow the metric's own tolerance only
            beyond = (metric.value.astype(float) > metric.threshold_value.astype(float)).any()
            assert set(metric.status) == {Status.FAIL if beyond else Status.PASS}, metric.detail.tolist()


@pytest.mark.slow
def test_rounding_level_model_holds_end_to_end_and_every_status_rejudges_from_the_written_numbers(tmp_path):
    from conftest import run_pipeline

    (tmp_path / "on").mkdir(), (tmp_path / "off").mkdir()
    code, frame = run_pipeline(tmp_path / "on", "+model=rounding_level", user_conf=True)
    assert code == 0, frame[frame.status.isin([Status.FAIL, "ERROR"])].detail.tolist()
    enveloped = frame[frame.rounding_envelope.notna() & (frame.excess > 0)]
    assert len(enveloped) and set(enveloped.status) == {Status.PASS}
    assert all(judge_record(r) == r["status"] for r in frame.to_dict("records"))  # as reportgen.verify does
    code, _ = run_pipeline(tmp_path / "off", "+model=rounding_level", "parity.rounding_envelope=false", user_conf=True)
    assert code == 1


def test_a_fault_that_switches_on_late_in_the_budget_run_is_not_put_down_to_rounding():
    """Found by a break-it pass: a forward counter that recompute advances twice as fast switches
    the output scale at step 11 of 16. With the gate over the first parity.steps steps only, the
    envelope (about Adam's learning rate) passed it; gradients taken in lockstep at identical
    weights differ from step 11 on, so the envelope does not apply and the twins trained apart."""
    from reportgen.checks.budget import task_metrics
    from reportgen.training.lockstep import lockstep_gradients

    setup = small_setup("+model=late_fault", "budget.examples=256", "budget.batch_size=16", user_conf=True)
    assert lockstep_gradients(setup, 0, 16) == 11  # forward + recompute: call 21 is step 11's forward
    frame = to_frame(task_metrics(Run(setup)))
    final = frame[frame.role == Role.FINAL_PARAMS].iloc[0]
    assert final.status == Status.FAIL and "trained apart" in final.detail and ROUNDING_LEVEL not in final.detail
    assert "first differ at step 11 of the budget run" in final.detail and final.lockstep_first_step == 11
    assert "rounding_excess" not in frame or frame.rounding_excess.isna().all()  # no rounding twin was trained
