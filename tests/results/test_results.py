"""Verdict rules of the claim (docs/architecture.md) and the frame contract."""

import pytest
from conftest import small_setup
from rows import judged_row, raised_row

from reportgen.checks.base.run import Run
from reportgen.files import atomic_write
from reportgen.results import Role, Row, check_summary, claim_verdict, frame_from_json, frame_to_json, to_frame

REQ = ["gradient parity", "state parity"]


def frame(*rows):
    return to_frame(
        [
            Row(check=check, item="x", variant="recompute", metric="m", value=1.0, status=status)
            for check, status in rows
        ]
    )


def test_all_required_pass_holds():
    assert claim_verdict(frame(("gradient parity", "PASS"), ("state parity", "PASS")), REQ) == "PASS"


@pytest.mark.parametrize("bad", ["FAIL", "ERROR", "NOT_RUN"])
def test_required_fail_error_not_run_fail_the_claim(bad):
    assert claim_verdict(frame(("gradient parity", "PASS"), ("state parity", bad)), REQ) == "FAIL"


def test_missing_required_check_fails_the_claim():
    assert claim_verdict(frame(("gradient parity", "PASS")), REQ) == "FAIL"


def test_warn_and_info_do_not_fail_and_flagged_never_counts():
    f = frame(
        ("gradient parity", "PASS"),
        ("gradient parity", "INFO"),
        ("state parity", "WARN"),
        ("larger-batch experiment", "FLAGGED"),
        ("state parity", "FLAGGED"),
    )
    assert claim_verdict(f, REQ) == "PASS"


def test_not_required_check_does_not_fail_the_claim():
    f = frame(("gradient parity", "PASS"), ("state parity", "PASS"), ("warm-step time", "FAIL"))
    assert claim_verdict(f, REQ) == "PASS"
    assert claim_verdict(f, REQ + ["warm-step time"]) == "FAIL"


@pytest.mark.parametrize(
    ("role", "parity", "expected"),
    [
        (Role.CONTROL, "FAIL", "FAIL"),  # a control stands only between the claim and PASS
        (Role.CONTROL, "PASS", "INCONCLUSIVE"),  # a missed control: that PASS could not have seen the fault
        (Role.AA, "FAIL", "INCONCLUSIVE"),  # a noisy baseline outranks a failure: recompute cannot be blamed
    ],
)
def test_a_missed_control_never_hides_a_failure_but_a_noisy_baseline_does(role, parity, expected):
    rows = [Row(check=check, item="x", variant="recompute", metric="m", value=1.0, status=parity) for check in REQ]
    rows.append(
        Row(check="controls", item="y", variant="recompute", role=role, metric="m", value=0.0, status="INCONCLUSIVE")
    )
    assert claim_verdict(to_frame(rows), REQ) == expected


def test_check_status_is_most_severe_and_fail_outranks_error():
    s = check_summary(frame(("gradient parity", "PASS"), ("gradient parity", "ERROR"), ("gradient parity", "FAIL")), [])
    assert s.status.tolist() == ["FAIL"] and s.failing.tolist() == [2]


def test_json_round_trip_keeps_values(tmp_path):
    f = to_frame(
        [
            Row(
                check="gradient parity",
                item="w",
                variant="recompute",
                metric="max_abs_err",
                value=0.25,
                status="FAIL",
                extra={"bitwise_equal": False},
            )
        ]
    )
    back = frame_from_json(frame_to_json(f))
    assert back.value.tolist() == [0.25] and back.bitwise_equal.tolist() == [False]


def test_atomic_write_never_overwrites(tmp_path):
    atomic_write(tmp_path / "a.txt", "one")
    with pytest.raises(FileExistsError):
        atomic_write(tmp_path / "a.txt", "two")
    assert (tmp_path / "a.txt").read_text() == "one"


def test_interrupt_leaves_partial_frame_with_not_run_rows(tmp_path, use_checks):
    """Ctrl-C inside a check: the rows measured so far and NOT_RUN rows for the rest stay on disk."""
    from reportgen.commands import run as pipeline

    def boom(setup):
        raise KeyboardInterrupt

    use_checks(
        (
            "gradient parity",
            lambda s: [judged_row("gradient parity", "loss", "max_abs_err", 0.0, "<=", 0.0, threshold="")],
        ),
        ("warm-step time", boom),
        ("task metrics", boom),
    )
    with pytest.raises(pipeline.Interrupted):
        pipeline.run_checks(Run(small_setup("+model=ffn")), tmp_path)
    partial = frame_from_json((tmp_path / "results.partial.json").read_text())
    assert partial.status.tolist() == ["PASS", "NOT_RUN", "NOT_RUN"]
    assert partial.check.tolist() == ["gradient parity", "warm-step time", "task metrics"]


def baseline_frame(*extra_rows):
    """Task metrics whose plain twin raised (an ERROR of the baseline) and whose recompute twin raised too."""
    broke = {"check": "task metrics", "item": "seed 0", "metric": "exception", "status": "ERROR"}
    rows = [
        Row(check="gradient parity", item="w", variant="recompute", metric="m", value=1.0, status="PASS"),
        Row(**broke, variant="plain", extra={"twin": "plain"}),
        Row(**broke, variant="recompute", extra={"twin": "recompute"}),
        *extra_rows,
    ]
    return to_frame(rows)


def test_a_check_whose_plain_twin_broke_cannot_be_judged_not_failed():
    req = ["gradient parity", "task metrics"]
    f = baseline_frame()
    assert dict(zip(*check_summary(f, req)[["check", "status"]].values.T)) == {
        "gradient parity": "PASS",
        "task metrics": "INCONCLUSIVE",
    }
    assert claim_verdict(f, req) == "INCONCLUSIVE"
    assert claim_verdict(f, ["gradient parity"]) == "PASS"  # not required: it decides nothing


def test_a_recompute_twin_raising_where_plain_does_not_still_fails_the_claim():
    req = ["gradient parity", "task metrics", "state parity"]
    f = baseline_frame(raised_row("state parity", "recompute", "", role="", twin="recompute"))
    assert claim_verdict(f, req) == "FAIL"
    # a measured FAIL in the same check outranks the broken baseline of another seed
    g = baseline_frame(judged_row("task metrics", "seed 1", "abs_diff_x", 1.0, "<=", 0.0))
    assert check_summary(g, req).set_index("check").status["task metrics"] == "FAIL"
    assert claim_verdict(g, req[:2]) == "FAIL"


def test_a_plain_metric_that_is_not_finite_is_an_error_of_the_baseline():
    from reportgen.checks.budget import nonfinite_metric_row

    row = nonfinite_metric_row(3, "accuracy", float("nan"))
    assert row.status == "ERROR" and row.extra["twin"] == "plain" and "non-finite" in row.detail
    f = to_frame(
        [Row(check="gradient parity", item="w", variant="recompute", metric="m", value=1.0, status="PASS"), row]
    )
    assert claim_verdict(f, ["gradient parity", "task metrics"]) == "INCONCLUSIVE"
