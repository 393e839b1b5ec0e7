"""The handed cases in ../shared/cases, run through the CLI as a user would.

Not part of the test suite (its name does not start with ``test_``): the suite depends on no
file outside the repository, and tests/test_fault_cases.py, test_memory.py and test_recompute.py
assert the same faults on our own fixtures. Run it by hand where ../shared exists:

    python -m pytest tests/handed_cases.py
"""
import pandas as pd
import pytest

from conftest import SMALL, TESTS, reportgen, run_dirs

CASES = TESTS.parent.parent / "shared" / "cases"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CASES.is_dir(), reason="no ../shared/cases here")]


def run_case(tmp_path, name, *overrides):
    """``(exit code, frame, {check: status})`` of one case run."""
    proc = reportgen(tmp_path, "--config-dir", str(TESTS / "cases_conf"), f"+model={name}", *SMALL, *overrides,
                     pythonpath=str(CASES))
    assert proc.returncode in (0, 1, 3), proc.stdout + proc.stderr
    frame = pd.read_csv(run_dirs(tmp_path)[-1] / "results.csv")
    status = frame.groupby("check", sort=False).status.agg(lambda s: next(
        x for x in ["FAIL", "ERROR", "NOT_RUN", "WARN", "PASS", "FLAGGED", "INFO"] if x in set(s))).to_dict()
    return proc.returncode, frame, status


def test_dropout_rng_without_preservation(tmp_path):
    code, frame, status = run_case(tmp_path, "dropout_rng", "recompute.preserve_rng_state=false")
    assert code == 1 and status["gradient parity"] == "FAIL" and status["optimizer-step parity"] == "FAIL"
    assert frame[(frame.check == "gradient parity") & (frame["item"] == "loss")].status.item() == "PASS"


def test_dropout_rng_with_preservation(tmp_path):
    code, frame, _ = run_case(tmp_path, "dropout_rng", "recompute.preserve_rng_state=true")
    assert code == 0, frame[frame.status.isin(["FAIL", "ERROR", "NOT_RUN"])].to_string()
    grads = frame[(frame.check == "gradient parity") & frame["item"].str.endswith(".grad")]
    assert grads.bitwise_equal.astype(bool).all()


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_batchnorm_stats(tmp_path, mode):
    code, frame, status = run_case(tmp_path, "batchnorm_stats", f"recompute={mode}")
    assert code == 1 and status["state parity"] == "FAIL" and status["gradient parity"] == "PASS"
    bad = frame[(frame.check == "state parity") & (frame.status == "FAIL")]["item"]
    assert bad.str.contains("running_mean").any() and bad.str.contains("num_batches_tracked").any()


def test_frozen_input_reentrant(tmp_path):
    code, frame, status = run_case(tmp_path, "frozen_input_reentrant", "recompute=reentrant")
    assert code == 1 and status["gradient parity"] == "FAIL"
    lost = frame[(frame.check == "gradient parity") & (frame.status == "FAIL")]
    assert lost.detail.str.contains("None in the recompute run").all() and len(lost) == 4


def test_frozen_input_non_reentrant(tmp_path):
    code, frame, _ = run_case(tmp_path, "frozen_input_reentrant", "recompute=non_reentrant")
    assert code == 0, frame[frame.status.isin(["FAIL", "ERROR", "NOT_RUN"])].to_string()


@pytest.mark.parametrize("mode,failing", [("reentrant", {"gradient parity", "state parity"}),
                                          ("non_reentrant", {"state parity"})])
def test_forward_counter(tmp_path, mode, failing):
    code, frame, status = run_case(tmp_path, "forward_counter", f"recompute={mode}")
    parity = {"gradient parity", "state parity"}
    assert code == 1 and {c for c in parity if status[c] == "FAIL"} == failing
    bad = frame[(frame.check == "state parity") & (frame.status == "FAIL")]["item"]
    assert set(bad.str.replace(" [input requires grad]", "", regex=False)) == {"attribute 0.calls", "attribute 1.calls"}


def test_granularity_per_child_saves_3_4x_per_layer(tmp_path):
    saved = {}
    for label, targets in (("per_layer", "[Layer]"), ("per_child", "[Mixer,MLP,LayerNorm]")):
        code, frame, status = run_case(tmp_path, "granularity", f"recompute.targets={targets}")
        assert status["gradient parity"] == "PASS" and status["state parity"] == "PASS"
        row = frame[(frame.check == "warm-step memory") & (frame.metric == "saved_activation_bytes")
                    & (frame.variant == "recompute") & (frame["item"] == "saved activations (total)")]
        saved[label] = row.value.item()
    assert saved["per_child"] / saved["per_layer"] == pytest.approx(3.4, abs=1e-9)


def test_sac_packet_policy_is_not_silent(tmp_path):
    code, frame, status = run_case(tmp_path, "sac_packet")
    assert status["gradient parity"] == "PASS"
    row = frame[(frame.check == "selective policy") & (frame["item"] == "aten.mm")].iloc[0]
    assert row.status == "WARN" and "aten.addmm" in row.detail
