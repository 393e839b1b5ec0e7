"""Each handed fault case, reproduced in tests/user_models, reaches the verdict its table states.

Run as a user model: composed from a config directory outside the package (tests/user_conf).
"""

import pytest
from conftest import compose_config, run_pipeline

from reportgen.checks.base.run import Run
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.checks.parity.step import step_and_state_parity
from reportgen.commands.run import prepare
from reportgen.report.diagnose import diagnose
from reportgen.report.metadata import recompute_settings
from reportgen.report.tried import look_and_try
from reportgen.results import check_summary, to_frame


def parity_status(*overrides):
    """``{check: status}`` and the frame, for the parity checks of a composed user config."""
    setup = prepare(compose_config(*overrides, user_conf=True))
    frame = to_frame(gradient_parity(Run(setup)) + step_and_state_parity(Run(setup)))
    summary = check_summary(frame, [])
    return dict(zip(summary.check, summary.status)), frame


def test_dropout_without_rng_preservation_fails_gradients_but_not_loss():
    status, frame = parity_status("+model=dropout_rng", "recompute.preserve_rng_state=false")
    assert status["gradient parity"] == "FAIL"
    assert status["optimizer-step parity"] == "FAIL"
    loss = frame[(frame.check == "gradient parity") & (frame["item"] == "loss")].iloc[0]
    assert loss.status == "PASS" and loss.bitwise_equal
    rng = frame[frame["item"].str.startswith("RNG torch.get_rng_state()")].iloc[0]
    assert rng.status == "FAIL"


def test_dropout_with_rng_preservation_is_bitwise_equal():
    status, frame = parity_status("+model=dropout_rng", "recompute.preserve_rng_state=true")
    assert set(status.values()) <= {"PASS", "INFO"}
    grads = frame[(frame.check == "gradient parity") & frame["item"].str.endswith(".grad")]
    assert len(grads) == 9 and grads.bitwise_equal.all()  # 8 parameters + input.grad


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_batchnorm_state_fails_gradients_pass(mode):
    status, frame = parity_status("+model=batchnorm_stats", f"recompute={mode}")
    assert status["state parity"] == "FAIL"
    assert status["gradient parity"] == "PASS"
    tracked = frame[frame["item"] == "buffer blocks.0.bn.num_batches_tracked"].iloc[0]
    assert tracked.status == "FAIL" and tracked.value == 1.0  # 2 batches tracked vs 1


def test_frozen_input_reentrant_loses_block_gradients():
    status, frame = parity_status("+model=frozen_input", "recompute=reentrant")
    assert status["gradient parity"] == "FAIL"
    lost = frame[(frame.check == "gradient parity") & (frame.status == "FAIL")]
    assert set(lost["item"]) == {f"adapters.{i}.proj.{p}.grad" for i in (0, 1) for p in ("weight", "bias")}
    assert lost.detail.str.contains("None in the recompute run").all()


def test_frozen_input_non_reentrant_passes():
    status, _ = parity_status("+model=frozen_input", "recompute=non_reentrant")
    assert set(status.values()) <= {"PASS", "INFO"}


def test_forward_counter_reentrant_fails_gradients_and_state():
    status, frame = parity_status("+model=forward_counter", "recompute=reentrant")
    assert status["gradient parity"] == "FAIL" and status["state parity"] == "FAIL"


def test_forward_counter_reentrant_fix_names_the_frozen_input_and_the_counter():
    """Reentrant recompute of a counter-reading forward on a plain input: the frozen input explains the
    raise, the counter the gradients that still differ once the input requires grad; one cause alone for
    a frozen input without a counter."""
    fixes = {}
    for model in ("forward_counter", "frozen_input"):
        setup = prepare(compose_config(f"+model={model}", "recompute=reentrant", user_conf=True))
        rows = gradient_parity(Run(setup)) + step_and_state_parity(Run(setup))
        said = diagnose(rows, look_and_try(Run(setup), rows, recompute_settings(setup)))  # as the pipeline does
        fixes[model] = next(r.extra["fix"] for r in said if r.check == "gradient parity")
    assert "enable_input_require_grads()" in fixes["forward_counter"]
    assert "move the update out of forward" in fixes["forward_counter"]
    assert "enable_input_require_grads()" in fixes["frozen_input"]
    assert "move the update out of forward" not in fixes["frozen_input"]


def test_forward_counter_non_reentrant_fails_state_and_names_the_attribute():
    status, frame = parity_status("+model=forward_counter", "recompute=non_reentrant")
    assert status["gradient parity"] == "PASS" and status["state parity"] == "FAIL"
    bad = frame[(frame.check == "state parity") & (frame.status == "FAIL")]
    assert set(bad["item"]) == {"attribute 0.steps", "attribute 1.steps"}
    assert "plain=1, recompute=2" in bad.detail.iloc[0]


def test_checkpoint_error_in_recompute_run_is_an_error_row_with_the_message():
    status, frame = parity_status(
        "+model=dropout_rng",
        "model._target_=user_models.faults.build_shape_shifter",
        "recompute.targets=[ShapeShifter]",
        "task.make_batch=user_models.faults.batch_small",
        "task.loss=user_models.faults.loss_sum",
    )
    errors = frame[frame.status == "ERROR"]
    assert status["gradient parity"] == "ERROR" and len(errors) >= 1
    assert errors.detail.str.contains("CheckpointError: torch.utils.checkpoint: Recomputed values").all()
    assert errors["item"].eq("recompute").all() and not errors.detail.str.contains("Tip:").any()


def test_plain_run_failure_says_the_claim_cannot_be_tested():
    status, frame = parity_status(
        "+model=dropout_rng",
        "model._target_=user_models.faults.build_broken",
        "recompute.targets=[Broken]",
        "task.make_batch=user_models.faults.batch_small",
    )
    assert set(status.values()) == {"INCONCLUSIVE"}  # no baseline: the claim cannot be judged (exit 3)
    assert frame.detail.str.contains("claim cannot be tested").all()
    assert frame.detail.str.contains("plain forward is broken").all()


def test_a_switch_that_recomputes_nothing_is_a_failing_report_not_a_usage_error(tmp_path):
    """LoRA on a frozen base, the model's own switch, reentrant: before issue 16 this was exit 2
    "cannot start"; it is the fault itself, so the report renders and the claim fails naming the fix."""
    code, frame = run_pipeline(tmp_path, "+model=lora_switch", "recompute=reentrant", user_conf=True)
    assert code == 1 and (tmp_path / "report.html").exists()
    observed = frame[frame.role == "observed"]
    assert observed.status.tolist() == ["FAIL"] and observed.value.tolist() == [0.0]
    lost = frame[(frame.check == "gradient parity") & frame["item"].str.contains("lora_") & (frame.status == "FAIL")]
    assert len(lost) == 8  # 2 layers x 2 adapted linears x (A, B): None under recompute
    fix = frame[(frame.role == "diagnosis") & (frame.check == "gradient parity")].detail.item()
    assert "enable_input_require_grads()" in fix and "use_reentrant=False" in fix


def test_adapters_alone_under_reentrant_recompute_raise_in_backward_and_name_the_fix(tmp_path):
    code, frame = run_pipeline(
        tmp_path, "+model=lora_switch", "recompute=reentrant", "++model.trainable_head=false", user_conf=True
    )
    assert code == 1 and (frame[frame.check == "gradient parity"].status == "ERROR").any()
    fix = frame[(frame.role == "diagnosis") & (frame.check == "gradient parity")].detail.item()
    assert "enable_input_require_grads()" in fix


def test_the_same_adapters_under_non_reentrant_recompute_pass(tmp_path):
    code, frame = run_pipeline(tmp_path, "+model=lora_switch", "recompute=non_reentrant", user_conf=True)
    bad = frame[frame.status.isin(["FAIL", "ERROR"]) & frame.check.isin(["gradient parity", "optimizer-step parity"])]
    assert bad.empty, bad[["check", "item", "detail"]].to_string()
    assert (frame.role == "observed").sum() == 0
