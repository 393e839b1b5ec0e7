"""Fixes that were tried (issue 43, item 6): a fix that is a setting is tried on the failing fixed-batch checks before
the diagnosis is written, a rule whose fix was tried and still fails is not the lead cause, the frozen-input rule needs
its cause seen, and flags a model's own switch sets are named as the switch's. Real models, real runs
(tests/user_models/faults.py and trials.py, composed from tests/user_conf)."""

from __future__ import annotations

import pytest
from conftest import FORKSERVER, run_pipeline, small_run

from reportgen.checks.distributed.check import distributed_checks
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.checks.parity.step import step_and_state_parity
from reportgen.config import DIST_GRADIENT_PARITY, DIST_STEP_PARITY, GRADIENT_PARITY, STATE_PARITY, STEP_PARITY
from reportgen.report.diagnose import diagnose
from reportgen.report.metadata import recompute_settings
from reportgen.report.tried import look_and_try, try_setting
from reportgen.twins.before_backward import frozen_regions, set_before_backward


def diagnosis(frame, check: str) -> dict:
    """The diagnosis row of ``check`` as a dict (``cause``, ``fix``, ``rule``, ``tried``)."""
    rows = frame[(frame.role == "diagnosis") & (frame.check == check)]
    assert len(rows) == 1, frame[frame.role == "diagnosis"][["check", "detail"]].to_string()
    return rows.iloc[0].to_dict()


def test_a_frozen_input_under_reentrant_recompute_leads_with_non_reentrant_tried_and_cleared(tmp_path):
    code, frame = run_pipeline(tmp_path, "+model=frozen_input", "recompute=reentrant", user_conf=True)
    assert code == 1
    said = diagnosis(frame, GRADIENT_PARITY)
    assert said["rule"] == "frozen input under reentrant"
    assert said["fix"].startswith("use recompute=non_reentrant (use_reentrant=False)")
    assert (
        "recompute=non_reentrant tried: clears it (every row passes: gradient parity, optimizer-step parity"
        in said["fix"]
    )
    assert said["tried"] in said["fix"] and said["tried"] in said["detail"]  # signed with results.json
    # the cause names the region seen fed by the frozen embedding, not the one after it
    assert "region adapters.0 requires grad (seen at the fixed batch" in said["cause"]


def test_two_faults_whose_fixes_clear_only_together_are_tried_together_and_keep_the_lead_cause(tmp_path):
    """ffn's first region gets the batch (no input requires grad) under reentrant recompute *and* its dropout is
    recomputed without its RNG state: each fix alone still fails (the other fault remains), both at once clear every
    row; the diagnosis says so and keeps the frozen-input cause instead of "no known pattern"."""
    code, frame = run_pipeline(tmp_path, "+model=ffn", "recompute=reentrant", "recompute.preserve_rng_state=false")
    assert code == 1
    said = diagnosis(frame, GRADIENT_PARITY)
    assert said["rule"] == "frozen input under reentrant", said["cause"]
    assert "recompute=non_reentrant tried: still fails" in said["fix"]
    assert "recompute=non_reentrant and recompute.preserve_rng_state=true tried: clears it" in said["fix"]


@pytest.mark.parametrize("mode", ["reentrant", "non_reentrant"])
def test_gradients_lost_for_a_cause_non_reentrant_does_not_cure_are_never_sent_to_non_reentrant(tmp_path, mode):
    """The region reads its own call counter: under reentrant recompute its parameters get None gradients (what the
    frozen-input rule used to fire on), under non-reentrant recompute they differ. Its input requires grad (a
    trainable stem feeds it), so the frozen-input rule does not apply and no diagnosis offers non_reentrant."""
    code, frame = run_pipeline(tmp_path, "+model=swapping", f"recompute={mode}", user_conf=True)
    assert code == 1
    lost = frame[(frame.check == GRADIENT_PARITY) & (frame.status == "FAIL") & frame.detail.str.startswith("None in")]
    assert (len(lost) > 0) == (mode == "reentrant")  # the symptom the old rule read
    said = diagnosis(frame, GRADIENT_PARITY)
    assert said["rule"] == "python state in forward" and "blocks.0.calls" in said["cause"]
    fixes = frame[frame.role == "diagnosis"].fix
    assert not fixes.str.contains("non_reentrant").any(), fixes.tolist()


def test_a_frozen_input_whose_non_reentrant_trial_still_fails_is_not_the_lead_cause(tmp_path):
    """Both causes at once: the batch feeds the first region (its input does not require grad) and the regions read
    their call counter. recompute=non_reentrant is tried, still fails, and is said so; it is not recommended."""
    code, frame = run_pipeline(
        tmp_path, "+model=swapping", "recompute=reentrant", "model.frozen_input=true", user_conf=True
    )
    assert code == 1
    said = diagnosis(frame, GRADIENT_PARITY)
    assert said["rule"] != "frozen input under reentrant"
    assert "not frozen input under reentrant, whose fix recompute=non_reentrant tried: still fails" in said["cause"]
    assert "state parity: attribute blocks.0.calls" in said["tried"]  # what the trial saw still differ
    assert "recompute=non_reentrant" not in said["fix"]


def test_a_preserve_rng_state_fix_is_tried_and_clears_dropout():
    run = small_run("+model=dropout_rng", "recompute.preserve_rng_state=false", user_conf=True)
    rows = gradient_parity(run) + step_and_state_parity(run)
    seen = look_and_try(run, rows, recompute_settings(run.setup))
    assert set(seen["tried"]) == {"recompute.preserve_rng_state=true"}
    trial = seen["tried"]["recompute.preserve_rng_state=true"]
    assert trial.checks == (GRADIENT_PARITY, STEP_PARITY, STATE_PARITY) and not any(trial.failing.values())
    assert trial.seconds > 0
    said = {r.check: r.extra for r in diagnose(rows, seen)}
    assert said[GRADIENT_PARITY]["rule"] == "RNG not replayed"
    assert "recompute.preserve_rng_state=true tried: clears it" in said[GRADIENT_PARITY]["fix"]
    assert "frozen_regions" not in seen  # not reentrant: nothing to look at


def test_a_setting_in_force_or_not_in_the_config_is_not_tried():
    run = small_run("+model=dropout_rng", "recompute.preserve_rng_state=false", user_conf=True)
    assert try_setting(run, "recompute=non_reentrant", [GRADIENT_PARITY]) is None  # already the mode
    assert try_setting(run, "recompute.no_such_key=true", [GRADIENT_PARITY]) is None
    assert try_setting(run, "recompute=no_such_mode", [GRADIENT_PARITY]) is None
    assert try_setting(run, "recompute.preserve_rng_state=true", ["trajectory parity"]) is None  # not re-run
    # what is measured is never changed: one rank has no sharded rows, which is not a pass
    assert try_setting(run, "distributed.world_size=1", [DIST_GRADIENT_PARITY]) is None
    assert try_setting(run, "recompute.targets=x", [GRADIENT_PARITY]) is None


def test_a_sharded_runs_failing_checks_are_re_run_on_its_ranks_with_the_setting():
    """Reentrant recompute behind a frozen embedding under DDP: the sharded rule's fix names recompute=non_reentrant,
    which is tried on 2 ranks (the sharded fixed-batch checks only) and clears them."""
    run = small_run(
        FORKSERVER,
        "+model=frozen_input",
        "recompute=reentrant",
        "distributed.world_size=2",
        "distributed.timeout_s=20",
        "distributed.strategy=ddp",
        "parity.steps=1",
        "budget.enabled=false",
        "timing.warmup_steps=0",
        "timing.measured_steps=1",
        user_conf=True,
    )
    rows = distributed_checks(run)
    assert any(r.check == DIST_GRADIENT_PARITY and r.status == "FAIL" for r in rows)
    seen = look_and_try(run, rows, recompute_settings(run.setup))
    trial = seen["tried"]["recompute=non_reentrant"]
    assert trial.checks == (DIST_GRADIENT_PARITY, DIST_STEP_PARITY) and trial.failing == {c: [] for c in trial.checks}
    said = next(r.extra for r in diagnose(rows, seen) if r.check == DIST_GRADIENT_PARITY)
    assert "recompute=non_reentrant tried: clears it (every row passes: distributed gradient parity" in said["fix"]


def test_the_regions_fed_inputs_that_do_not_require_grad_are_seen():
    assert frozen_regions(small_run("+model=frozen_input", "recompute=reentrant", user_conf=True).setup) == [
        "adapters.0"
    ]
    assert frozen_regions(small_run("+model=swapping", "recompute=reentrant", user_conf=True).setup) == []
    frozen = small_run("+model=swapping", "recompute=reentrant", "model.frozen_input=true", user_conf=True)
    assert frozen_regions(frozen.setup) == ["blocks.0"]


def test_flags_the_models_switch_sets_are_named_as_the_switchs_and_its_fix_holds(tmp_path):
    seen = set_before_backward(small_run("+model=switched", user_conf=True).setup)
    assert seen["layers.0.recompute"] == (False, True, "as built")
    assert seen["layers.1.training_switch"] == (False, True, "in the forward")
    code, frame = run_pipeline(tmp_path / "flags", "+model=switched", user_conf=True)
    assert code == 1
    said = diagnosis(frame, STATE_PARITY)
    assert said["rule"] == "flag set before recompute"
    assert (
        "the model's own switch (recompute.enable) sets layers.0.recompute (plain=False, recompute=True)"
        in said["cause"]
    )
    assert "its forward sets layers.0.training_switch (plain=False, recompute=True)" in said["cause"]
    assert "move the update out of forward" not in said["fix"]
    assert "state.ignore_attributes=[*.recompute, *.training_switch]" in said["fix"]
    code, frame = run_pipeline(
        tmp_path / "ignored",
        "+model=switched",
        "state.ignore_attributes=[*.recompute,*.training_switch]",
        user_conf=True,
    )
    assert code == 0, frame[frame.status.isin(["FAIL", "ERROR", "INCONCLUSIVE"])][["check", "item"]].to_string()
