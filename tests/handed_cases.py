"""The handed cases in ../shared/cases, run through the CLI as a user would.

Not part of the test suite (its name does not start with ``test_``): the suite depends on no
file outside the repository, and tests/checks/test_fault_cases.py, test_memory.py and test_recompute.py
assert the same faults on our own fixtures. Run it by hand where ../shared exists:

    python -m pytest tests/handed_cases.py
"""

import pandas as pd
import pytest
from conftest import SMALL, TESTS, reportgen, run_dirs

from reportgen.results import SEVERITY

CASES = TESTS.parent.parent / "shared" / "cases"
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CASES.is_dir(), reason="no ../shared/cases here")]


def run_case(tmp_path, name, *overrides):
    """``(exit code, frame, {check: status})`` of one case run."""
    proc = reportgen(
        tmp_path, "--config-dir", str(TESTS / "cases_conf"), f"+model={name}", *SMALL, *overrides, pythonpath=str(CASES)
    )
    assert proc.returncode in (0, 1, 3), proc.stdout + proc.stderr
    frame = pd.read_csv(run_dirs(tmp_path)[-1] / "results.csv")
    status = frame.groupby("check", sort=False).status.agg(lambda s: next(x for x in SEVERITY if x in set(s))).to_dict()
    return proc.returncode, frame, status


def broken(frame) -> str:
    """The rows that keep a claim from holding, for an assertion's message."""
    bad = frame[frame.status.isin(["INCONCLUSIVE", "FAIL", "ERROR", "NOT_RUN"])]
    return bad[["check", "item", "status", "detail"]].to_string()


def test_dropout_rng_without_preservation(tmp_path):
    code, frame, status = run_case(tmp_path, "dropout_rng", "recompute.preserve_rng_state=false")
    assert code == 1 and status["gradient parity"] == "FAIL" and status["optimizer-step parity"] == "FAIL"
    assert frame[(frame.check == "gradient parity") & (frame["item"] == "loss")].status.item() == "PASS"


def test_dropout_rng_with_preservation(tmp_path):
    code, frame, _ = run_case(tmp_path, "dropout_rng", "recompute.preserve_rng_state=true")
    assert code == 0, broken(frame)
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
    assert code == 0, broken(frame)


@pytest.mark.parametrize(
    "mode,failing", [("reentrant", {"gradient parity", "state parity"}), ("non_reentrant", {"state parity"})]
)
def test_forward_counter(tmp_path, mode, failing):
    code, frame, status = run_case(tmp_path, "forward_counter", f"recompute={mode}")
    parity = {"gradient parity", "state parity"}
    assert code == 1 and {c for c in parity if status[c] == "FAIL"} == failing
    bad = frame[(frame.check == "state parity") & (frame.status == "FAIL")]["item"]
    assert set(bad.str.replace(" [input requires grad]", "", regex=False)) == {"attribute 0.calls", "attribute 1.calls"}


def test_granularity_per_child_saves_3_4x_per_layer(tmp_path):
    """Both hold (the case's EXPECT: verdict PASS for each). The codes are asserted last, so that
    the ratio is checked even where a run does not exit 0."""
    saved, codes, why = {}, {}, {}
    for label, targets in (("per_layer", "[Layer]"), ("per_child", "[Mixer,MLP,LayerNorm]")):
        code, frame, status = run_case(tmp_path, "granularity", f"recompute.targets={targets}")
        codes[label], why[label] = code, f"{label} exits {code}:\n{broken(frame)}"
        assert status["gradient parity"] == "PASS" and status["state parity"] == "PASS"
        row = frame[
            (frame.check == "warm-step memory")
            & (frame.metric == "saved_activation_bytes")
            & (frame.variant == "recompute")
            & (frame["item"] == "saved activations (total)")
        ]
        saved[label] = row.value.item()
    assert saved["per_child"] / saved["per_layer"] == pytest.approx(3.4, abs=1e-9)
    assert codes == {"per_layer": 0, "per_child": 0}, "\n".join(why[label] for label in codes if codes[label])


def test_sac_packet_policy_is_not_silent(tmp_path):
    code, frame, status = run_case(tmp_path, "sac_packet")
    assert code == 0 and status["gradient parity"] == "PASS", broken(frame)
    row = frame[(frame.check == "selective policy") & (frame["item"] == "aten.mm")].iloc[0]
    assert row.status == "WARN" and "aten.addmm" in row.detail


# --------------------------------------------------------------------------- measured bytes of the handed cases
# (moved from tests/memory/test_memory.py: they import the case files themselves)
from conftest import compose_config, measured  # noqa: E402

from reportgen.commands.run import prepare  # noqa: E402

SHARED_CASES = CASES


@pytest.mark.skipif(not (SHARED_CASES / "granularity.py").exists(), reason="../shared/cases not present")
def test_handed_granularity_case_saves_17_vs_5_activations(monkeypatch):
    """shared/cases/granularity.py: 4 Layers of width 64, batch [4, 128, 64]; the case states 3.4x."""
    monkeypatch.syspath_prepend(str(SHARED_CASES))
    conf = f"hydra.searchpath=[file://{TESTS / 'cases_conf'}]"
    unit = 4 * 128 * 64 * 4
    totals = {}
    for name, targets in {"per_layer": "[Layer]", "per_child": "[Mixer,MLP,LayerNorm]"}.items():
        setup = prepare(
            compose_config(conf, "+model=granularity", "parity.batch_size=4", f"recompute.targets={targets}")
        )
        totals[name] = measured(setup, recompute=True).total_bytes
    assert totals == {"per_layer": 5 * unit, "per_child": 17 * unit}
    assert totals["per_child"] / totals["per_layer"] == pytest.approx(3.4)


# --- every handed case: the recompute twin's saved bytes, derived by hand -------------------
# B examples per batch (parity.batch_size); f32 = 4 bytes, int64 = 8 bytes. The cross-entropy
# of these cases keeps log_softmax's output, the int64 targets and a 0-dim float total weight.
def _xent(rows: int, classes: int) -> int:
    return rows * classes * 4 + rows * 8 + 4


HANDED = {
    # FeedForward blocks (width 32) keep only their input [B, 32] each; the loss keeps out - target.
    "dropout_rng": ([], lambda b: (3 + 1) * b * 32 * 4),
    # ConvBlocks keep their input [B, 8, 8, 8]; the rest: the stem conv's input [B, 1, 8, 8], the head's
    # input [B, 8] and the cross-entropy over [B, 10].
    "batchnorm_stats": ([], lambda b: 2 * b * 8 * 64 * 4 + b * 64 * 4 + b * 8 * 4 + _xent(b, 10)),
    # Blocks keep their input [B, 12, 16] (even though it needs no grad: recomputation needs it); the
    # rest: the head's input [B, 12, 16] and the cross-entropy over [B·12, 50]; the frozen embedding keeps nothing.
    "frozen_input_reentrant": ([], lambda b: 3 * b * 12 * 16 * 4 + _xent(b * 12, 50)),
    # CountingBlocks keep their input [B, 16]; the loss keeps out - target.
    "forward_counter": ([], lambda b: (2 + 1) * b * 16 * 4),
    # Selective with aten.mm: nn.Linear on [B, 64] calls aten.addmm, so nothing is saved inside the
    # blocks: each keeps its input [B, 64], the loss keeps out - target ...
    "sac_packet": ([], lambda b: (3 + 1) * b * 64 * 4),
}
# ... and naming aten.addmm saves a's output [B, 256] and b's output [B, 64] in each of the 3 blocks.
HANDED["sac_packet_addmm"] = (["recompute.save_ops=[aten.addmm]"], lambda b: (3 * (1 + 4 + 1) + 1) * b * 64 * 4)


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="../shared/cases not present")
@pytest.mark.parametrize("case", sorted(HANDED))
def test_handed_case_recompute_saved_bytes_match_the_derivation(case, monkeypatch):
    monkeypatch.syspath_prepend(str(SHARED_CASES))
    overrides, expected = HANDED[case]
    batch = 6
    setup = prepare(
        compose_config(
            f"hydra.searchpath=[file://{TESTS / 'cases_conf'}]",
            f"+model={case.removesuffix('_addmm')}",
            f"parity.batch_size={batch}",
            *overrides,
        )
    )
    assert measured(setup, recompute=True).total_bytes == expected(batch)
