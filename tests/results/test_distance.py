"""Measuring tensor distances and judging them against assert_close's rule."""

import math

import torch

from reportgen.results import Status, judge
from reportgen.results.compared import tensor_row
from reportgen.results.distance import measure, tolerances


def within(d):
    """The status judge() gives a distance: the allclose rule on its worst excess."""
    return judge(d.max_abs_err, "allclose", float("nan"), excess=d.worst_excess) == Status.PASS


def test_defaults_are_assert_close_defaults():
    assert tolerances(torch.float32) == (1.3e-6, 1e-5)
    assert tolerances(torch.float64) == (1e-7, 1e-7)
    assert tolerances(torch.bfloat16) == (1.6e-2, 1e-5)
    assert tolerances(torch.int64) == (0.0, 0.0)
    assert tolerances(torch.float32, rtol=1e-3) == (1e-3, 1e-5)


def test_measure_matches_hand_computed_errors():
    b = torch.tensor([1.0, -2.0, 0.0, 4.0])
    a = torch.tensor([1.0, -2.5, 1e-6, 4.0])
    d = measure(a, b, rtol=0.0, atol=1e-3)
    assert d.max_abs_err == 0.5
    assert math.isclose(d.max_rel_err, 0.25)
    assert not d.bitwise_equal and not within(d)
    assert within(measure(a, b, rtol=0.3, atol=1e-5))


def test_assert_close_agrees_with_judge():
    torch.manual_seed(0)
    b = torch.randn(100)
    for scale in (1e-7, 1e-6, 1e-5, 1e-4):
        a = b + scale * torch.randn(100)
        rtol, atol = tolerances(torch.float32)
        try:
            torch.testing.assert_close(a, b)
            expected = True
        except AssertionError:
            expected = False
        assert within(measure(a, b, rtol, atol)) is expected


def test_none_in_one_run_is_fail_none_in_both_is_pass():
    t = torch.ones(3)
    assert tensor_row("gradient parity", "w.grad", t, None, None, None).status == "FAIL"
    assert tensor_row("gradient parity", "w.grad", None, t, None, None).status == "FAIL"
    assert tensor_row("gradient parity", "w.grad", None, None, None, None).status == "PASS"


def test_nan_and_inf_are_never_equal_even_to_themselves():
    a = torch.tensor([float("nan"), 1.0])
    both = measure(a, a.clone(), 0, 0)
    assert not both.bitwise_equal and not within(both) and both.nonfinite_a == both.nonfinite_b == 1
    inf = torch.tensor([float("inf"), 1.0])
    assert not within(measure(inf, inf.clone(), 1.0, 1.0))
    assert not within(measure(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]), 0, 1.0))
    assert within(measure(torch.tensor([2.0, 1.0]), torch.tensor([2.0, 1.0]), 0, 0))


def test_tolerance_used_is_the_deciding_number_not_the_relative_error():
    """A near-zero entry off by half of atol gives a relative error of 500 on a passing tensor;
    the share of tolerance used (0.5, worst element) decides, and the row says where the
    relative figure comes from."""
    b = torch.tensor([1.0, 1e-9, 0.0], dtype=torch.float64)
    a = b + torch.tensor([1e-7, 5e-7, 0.0], dtype=torch.float64)
    d = measure(a, b, rtol=1e-5, atol=1e-6)
    assert math.isclose(d.tolerance_used, 0.5, rel_tol=1e-6) and d.max_rel_err > 400 and within(d)
    row = tensor_row("gradient parity", "w.grad", b, a, 1e-5, 1e-6)
    assert row.status == Status.PASS and math.isclose(row.extra["tolerance_used"], 0.5, rel_tol=1e-6)
    assert "uses 50% of it" in row.detail and "near zero, where atol decides" in row.detail
    over = measure(b + 3e-6, b, rtol=0.0, atol=1e-6)
    assert math.isclose(over.tolerance_used, 3.0, rel_tol=1e-6) and not within(over)
    assert measure(b + 1, b, 0.0, 0.0).tolerance_used == math.inf


def test_a_trajectory_step_row_shows_the_share_of_tolerance_that_decided_it():
    from reportgen.checks.parity.trajectory import step_rows

    b = torch.tensor([1.0, 1e-9], dtype=torch.float64)
    near_zero = tensor_row(
        "trajectory parity", "param w", b, b + torch.tensor([0.0, 5e-7], dtype=torch.float64), 1e-5, 1e-6, aa=b.clone()
    )
    over = tensor_row("trajectory parity", "param v", b, b + 3e-6, 0.0, 1e-6, aa=b.clone())
    (passing, aa), (failing, _) = step_rows(1, [near_zero]), step_rows(2, [near_zero, over])
    assert (
        passing.metric == "tolerance_used"
        and math.isclose(passing.value, 0.5, rel_tol=1e-6)
        and passing.status == Status.PASS
    )
    assert near_zero.extra["max_rel_err"] > 400  # the figure the row used to print beside PASS
    assert math.isclose(failing.value, 3.0, rel_tol=1e-6) and failing.status == "FAIL"
    assert aa.value == 0.0 and aa.status == Status.PASS


def test_chunks_give_the_figures_of_one_pass_wherever_the_worst_element_lies(monkeypatch):
    from reportgen.results import distance

    torch.manual_seed(0)
    b = torch.randn(1000)
    a = b + 1e-6 * torch.randn(1000)
    a[17], a[901] = float("nan"), b[901] + 0.5  # a NaN in the first chunk, the largest difference in the last
    b[400:600] = 0.0  # a chunk of zeros: no relative error there
    whole = measure(a, b, 1.3e-6, 1e-5)
    monkeypatch.setattr(distance, "CHUNK", 128)
    chunked = measure(a, b, 1.3e-6, 1e-5)
    assert chunked == whole
    assert (whole.max_abs_err, whole.nonfinite_a, whole.bitwise_equal) == (math.inf, 1, False)
    a[17] = b[17]
    assert measure(a, b, 1.3e-6, 1e-5).max_abs_err == float((a - b).abs().max())
