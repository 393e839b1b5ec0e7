"""Verdict truth (issue 8): every generator seeded, an A/A control, trajectory parity,
non-finite values never equal, side estimates never decide, a diagnosis for each failure.
Own fixtures in tests/user_models/truth.py (no ../shared needed)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import SMALL, compose_config, run_pipeline
from rows import allclose_row

from reportgen.checks.base.run import Run
from reportgen.report.diagnose import diagnose
from reportgen.results import Role, Status
from reportgen.rng import fingerprint, seeded


#: Small budgets: these tests are about parity, not about training length or timing.
def run_model(tmp_path, *overrides):
    """``(exit code, frame, {check: statuses})`` of a full pipeline run on a tests/user_conf model."""
    code, frame = run_pipeline(tmp_path, *overrides, user_conf=True)
    status = {c: sorted(set(g.status)) for c, g in frame.groupby("check", sort=False)}
    return code, frame, status


def test_seeded_controls_every_generator_and_restores_the_callers():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    before = fingerprint()
    draws = []
    for _ in range(2):
        with seeded(7):
            draws.append((random.random(), float(np.random.rand()), float(torch.rand(()))))
    assert draws[0] == draws[1]
    after = fingerprint()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_python_random_layerdrop_outside_the_region_passes(tmp_path, mode):
    code, frame, status = run_model(tmp_path, "+model=layerdrop", f"recompute={mode}")
    assert code == 0, frame[frame.status.isin([Status.FAIL, "ERROR", Status.INCONCLUSIVE])].detail.tolist()
    grads = frame[frame.role == Role.PARAM_GRAD]
    assert len(grads) == 4 * 6 + 2 + 2 and grads.bitwise_equal.astype(bool).all()
    rng = frame[(frame.role == Role.RNG) & frame["item"].str.startswith("RNG random.getstate()")]
    assert rng.status.tolist() == [Status.PASS]


def test_without_python_seeding_layerdrop_would_differ(monkeypatch):
    """The control that shows the test above can fail: seed torch only, as before."""
    import reportgen.rng as rng

    monkeypatch.setattr(rng.random, "seed", lambda *a, **k: None)
    monkeypatch.setattr(rng.random, "setstate", lambda *a, **k: None)
    from reportgen.checks.parity.gradient import gradient_parity
    from reportgen.commands.run import prepare

    rows = gradient_parity(Run(prepare(compose_config("+model=layerdrop", *SMALL, user_conf=True))))
    assert any(r.status != Status.PASS for r in rows if r.role in (Role.LOSS, Role.PARAM_GRAD, Role.AA))


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_autograd_grad_inside_the_region_passes_and_the_flop_count_is_only_a_warning(tmp_path, mode):
    code, frame, status = run_model(tmp_path, "+model=force_inside", f"recompute={mode}")
    assert code == 0, frame[frame.status.isin([Status.FAIL, "ERROR"])].detail.tolist()
    flops = frame[frame.role == Role.FLOPS].iloc[0]
    if mode == "reentrant":
        assert flops.status == "WARN" and "not estimated" in flops.detail
    assert "ERROR" not in status["warm-step time"]


def test_a_fault_invisible_at_step_one_fails_naming_the_first_diverging_step(tmp_path):
    code, frame, status = run_model(tmp_path, "+model=observer")
    assert status["gradient parity"] == [Status.PASS] and Status.PASS in status["optimizer-step parity"]
    assert Status.FAIL in status["trajectory parity"] and code == 1
    first = frame[frame.role == Role.FIRST_DIVERGENCE].iloc[0]
    assert first.value == 2 and "step 1 was equal" in first.detail
    steps = frame[(frame.role == Role.TRAJECTORY) & (frame.variant == "recompute")].set_index("step").status
    assert steps[1] == Status.PASS and steps[2] == Status.FAIL
    diagnosis = frame[(frame.role == Role.DIAGNOSIS) & (frame.check == "trajectory parity")].iloc[0]
    assert diagnosis.rule == "visible after a step" and "updated twice per step" in diagnosis.detail


def test_a_nondeterministic_plain_twin_is_inconclusive_exit_3(tmp_path):
    code, frame, status = run_model(tmp_path, "+model=noisy")
    assert code == 3
    aa = frame[(frame.role == Role.AA) & (frame.check == "gradient parity")].iloc[0]
    assert aa.status == Status.INCONCLUSIVE and aa.value > 0 and "not reproducible against itself" in aa.detail
    html = (tmp_path / "report.html").read_text()
    assert "CANNOT BE JUDGED" in html and "Why it cannot be judged" in html


def test_nan_in_both_twins_is_never_pass(tmp_path):
    code, frame, _ = run_model(tmp_path, "+model=nan_both")
    assert code == 3
    loss = frame[frame.role == Role.LOSS].iloc[0]
    assert loss.status == Status.FAIL and not loss.bitwise_equal
    finite = frame[frame.role == Role.NONFINITE].iloc[0]
    assert finite.status == Status.INCONCLUSIVE and finite.first_nonfinite == "loss"


def test_a_failing_report_explains_itself_with_both_values(tmp_path):
    code, frame, _ = run_model(tmp_path, "+model=dropout_rng", "recompute.preserve_rng_state=false")
    assert code == 1
    html = (tmp_path / "report.html").read_text()
    page_one = html[: html.index("<h2>Checks</h2>")]
    assert "Why it fails" in page_one and "preserve_rng_state=true" in page_one
    # the worst item of each check, its measured difference and share of tolerance, and how many fail
    # (issue 28: not the first failing row, not two rounded norms that look equal)
    grads = frame[(frame.check == "gradient parity") & (frame.status == Status.FAIL)]
    worst = grads.loc[grads.tolerance_used.idxmax()]
    why = page_one[page_one.index("Why it fails") :]
    assert why.index(worst["item"].split(".")[-2]) < why.index("optimizer-step parity")
    assert f"difference {worst.value:.3g}, {worst.tolerance_used:.3g}× its tolerance" in why
    assert f"{len(grads)} of " in why and "‖·‖" not in why
    assert why.count("Likely cause:") == 1 and "the same cause and fix as gradient parity" in why


def test_diagnosis_names_a_different_forward_first():
    rows = [
        allclose_row("gradient parity", "loss", 1.0, 1.0, role=Role.LOSS),
        allclose_row("state parity", "buffer bn.running_mean", 1.0, 1.0, role=Role.BUFFER),
    ]
    out = {r.check: r.extra["rule"] for r in diagnose(rows, {"mode": "non_reentrant", "preserve_rng_state": True})}
    assert out == {"gradient parity": "different forward", "state parity": "running statistics"}


def test_a_loss_that_goes_nan_is_named_not_blamed_on_non_determinism(tmp_path):
    """tests/user_conf/model/lr_blowup.yaml: lr=1e30, so step 1 is finite and the loss is inf from step 2
    on in every twin. The trajectory check states the plain twin's first non-finite value, and its
    diagnosis names the non-finite loss and the training settings, not randomness the run does not control."""
    code, frame, _ = run_model(tmp_path, "+model=lr_blowup")
    assert code == 3  # the baseline itself is broken: INCONCLUSIVE, never "recompute fails"
    trajectory = frame[frame.check == "trajectory parity"]
    finite = trajectory[trajectory.role == Role.NONFINITE].iloc[0]
    assert finite.status == Status.INCONCLUSIVE and finite.first_nonfinite == "loss at step 2"
    first = trajectory[trajectory.role == Role.FIRST_DIVERGENCE].iloc[0]
    assert first.value == 2 and "state read in forward" not in first.detail
    why = trajectory[trajectory.role == Role.DIAGNOSIS].iloc[0]
    assert why.rule == "plain twin non-finite"
    assert "NaN or Inf without any recomputation" in why.cause and "not a recompute non-determinism" in why.cause
    assert "learning rate too high (parity.optimizer.lr" in why.fix and "deterministic" not in why.detail
    html = (tmp_path / "report.html").read_text()
    assert "plain twin finite: the plain twin computes non-finite values (NaN/Inf), first in loss at step 2" in html


def test_a_step_whose_plain_weights_are_not_finite_is_diagnosed_as_such():
    """Optimizer-step parity has no finiteness row of its own: a failing tensor row whose plain value holds
    NaN/Inf (``nonfinite_plain``, as results.rows writes it) is enough, before the A/A rule blames randomness."""
    rows = [
        allclose_row(
            "optimizer-step parity",
            "param 0.net.0.weight",
            float("nan"),
            float("inf"),
            role=Role.PARAM,
            variant=variant,
            on_miss=on_miss,
            extra={"nonfinite_plain": nonfinite},
        )
        for variant, on_miss, nonfinite in (("recompute", Status.FAIL, 24), ("aa", Status.INCONCLUSIVE, 0))
    ]
    (why,) = diagnose(rows, {"mode": "non_reentrant", "preserve_rng_state": True})
    assert why.extra["rule"] == "plain twin non-finite" and "parity.optimizer.lr" in why.extra["fix"]
    rows[0].extra["nonfinite_plain"] = 0  # finite plain values, A/A differs: the randomness rule again
    assert diagnose(rows, {"mode": "non_reentrant"})[0].extra["rule"] == "plain twin not reproducible"
