"""Warm-step time: bootstrap CI, interleaving, FLOP bound and deadlines."""

import numpy as np
import pytest
import torch
from conftest import compose_config

from reportgen.checks.base.run import Run
from reportgen.checks.timing.check import interleaved_times, step_flops, warm_step_time
from reportgen.checks.timing.rows import flops_row, median_rows, overhead_row
from reportgen.commands.run import prepare
from reportgen.config import TIME
from reportgen.results import Role, Status
from reportgen.results.bootstrap import bootstrap_ratio_ci
from reportgen.twins.twin import TrainStep, timed


def test_bootstrap_of_an_exact_ratio_has_a_zero_width_interval():
    plain = [10.0, 11.0, 12.0, 13.0, 50.0]
    ratio, low, high = bootstrap_ratio_ci(plain, [1.25 * t for t in plain], samples=500)
    assert ratio == pytest.approx(1.25) and low == pytest.approx(1.25) and high == pytest.approx(1.25)


def test_the_paired_ratio_cancels_drift_that_both_steps_of_a_round_share():
    drift = np.linspace(10, 40, 30)  # the machine slows down 4x over the run
    ratio, low, high = bootstrap_ratio_ci(drift, 1.3 * drift, samples=500)
    assert ratio == pytest.approx(1.3) and high - low == pytest.approx(0.0)
    row = overhead_row({"plain": list(drift), "recompute": list(1.3 * drift[::-1])}, 500, None)
    assert row.extra["ci_half_width_pp"] > 20  # unpaired in time: the drift is all noise


def test_bootstrap_interval_covers_the_truth_and_narrows_with_more_steps():
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(40):
        plain = 20 + rng.normal(0, 1, 31)
        recompute = 26 + rng.normal(0, 1, 31)  # true median ratio 1.3
        ratio, low, high = bootstrap_ratio_ci(plain, recompute, samples=400, seed=trial)
        assert low <= ratio <= high
        covered += low <= 1.3 <= high
    assert covered >= 34  # nominal 95%: 38 of 40; allow the percentile bootstrap's small-sample undercoverage
    widths = []
    for n in (10, 160):
        plain, recompute = 20 + rng.normal(0, 1, n), 26 + rng.normal(0, 1, n)
        _, low, high = bootstrap_ratio_ci(plain, recompute, samples=1000)
        widths.append(high - low)
    assert widths[1] < widths[0] / 2
    assert bootstrap_ratio_ci(plain, recompute, 300, seed=3) == bootstrap_ratio_ci(plain, recompute, 300, seed=3)


def test_bootstrap_refuses_unpaired_samples():
    with pytest.raises(ValueError):
        bootstrap_ratio_ci([1.0, 2.0], [1.0])


def test_rounds_alternate_their_order_and_warmup_is_not_timed():
    calls = []
    steps = {"plain": lambda: calls.append("p"), "recompute": lambda: calls.append("r")}
    times, stopped = interleaved_times(steps, warmup=3, measured=4, device=torch.device("cpu"))
    assert "".join(calls) == "prrppr" + "prrpprrp"
    assert [len(v) for v in times.values()] == [4, 4] and stopped == "4 rounds configured"


def test_adaptive_rounds_stop_at_the_confidence_target_or_the_time_budget():
    steps = {"plain": lambda: None, "recompute": lambda: None}
    checks = []

    def enough(times):
        checks.append(len(times["plain"]))
        return len(times["plain"]) >= 13

    times, stopped = interleaved_times(steps, 0, 5, torch.device("cpu"), enough)
    assert checks == [5, 9, 13] and len(times["plain"]) == 13 and stopped == "confidence target reached"
    times, stopped = interleaved_times(steps, 0, 5, torch.device("cpu"), lambda t: False, max_seconds=0.0)
    assert len(times["plain"]) == 5 and stopped.startswith("time budget")


def test_timed_measures_milliseconds():
    import time

    assert 15 <= timed(lambda: time.sleep(0.02), torch.device("cpu")) < 200


def _times(plain_ms, ratio):
    return {"plain": list(plain_ms), "recompute": [ratio * t for t in plain_ms]}


def test_overhead_deadline_missed_says_by_how_much():
    row = overhead_row(_times([10, 11, 12, 13], 1.5), 200, max_ratio=1.2)
    assert row.status == Status.FAIL and row.metric == "overhead_ratio"
    assert "deadline missed" in row.detail and "0.300 over" in row.detail


def test_overhead_within_deadline_passes_and_no_deadline_is_info():
    assert overhead_row(_times([10, 11, 12, 13], 1.1), 200, max_ratio=1.2).status == Status.PASS
    row = overhead_row(_times([10, 11, 12, 13], 1.1), 200, max_ratio=None)
    assert row.status == Status.INFO and row.extra["ci_half_width_pp"] == pytest.approx(0.0)


def test_overhead_whose_interval_straddles_the_deadline_is_not_conclusive():
    times = {"plain": [10.0] * 8, "recompute": [11.0, 11.0, 11.0, 11.0, 13.0, 13.0, 13.0, 13.0]}
    row = overhead_row(times, 500, max_ratio=1.25)  # per-round ratios 1.1 and 1.3: median 1.2, CI up to 1.3
    assert row.value == pytest.approx(1.2) and row.extra["ci_high"] > 1.25
    assert row.status == Status.WARN and "not conclusive" in row.detail


def test_step_time_deadline_missed_on_the_recompute_median():
    rows = {r.variant: r for r in median_rows(_times([10, 20, 30], 2.0), max_step_time_ms=25.0, seconds=0.0)}
    assert rows["plain"].status == Status.INFO and rows["plain"].value == 20.0
    rec = rows["recompute"]
    assert rec.status == Status.FAIL and rec.value == 40.0 and "15 ms (60.0%) over" in rec.detail
    assert rec.extra["p25_ms"] == 30.0 and rec.extra["iqr_ms"] == 20.0


def test_flop_bound_is_one_more_forward_of_the_wrapped_layers():
    """Granularity stack: forward = Mix's W×W + Feed's W×4W and 4W×W Linears = 18·B·S·W² FLOPs per
    layer, backward twice that (input and weight gradients): 54·B·S·W² per plain step and layer.
    Recomputation adds at most one forward; non-reentrant recompute stops as soon as the last
    tensor backward needs (ReLU's output) is rebuilt, so the down-projection (8·B·S·W²) is not
    rerun: (54 + 10) / 54 = 32/27."""
    setup = prepare(compose_config("+model=granularity", "parity.batch_size=2", user_conf=True))
    optimizer = {"_target_": "torch.optim.SGD", "lr": 0.0}
    flops = {
        v: step_flops(TrainStep(setup.twin(v == "recompute", optimizer=optimizer), setup.batch))
        for v in ("plain", "recompute")
    }
    b, s, w = 2, 32, 16
    assert flops["plain"] == 3 * 54 * b * s * w * w
    row = flops_row(flops)
    assert row.metric == "expected_overhead_ratio" and row.value == pytest.approx(32 / 27)
    assert row.extra["wrapped_forward_flops"] == 3 * 10 * b * s * w * w


def test_warm_step_time_rows():
    setup = prepare(
        compose_config(
            "+model=granularity",
            "timing.warmup_steps=1",
            "timing.measured_steps=5",
            "timing.bootstrap_samples=100",
            "timing.max_overhead_ratio=100",
            "timing.target_ci_half_width_pp=null",
            user_conf=True,
        )
    )
    rows = warm_step_time(Run(setup))
    assert all(r.check == TIME for r in rows)
    steps = [r for r in rows if r.item.startswith("step ")]
    assert len(steps) == 10 and all(r.value > 0 and r.metric == "step_time_ms" for r in steps)
    overhead = next(r for r in rows if r.metric == "overhead_ratio")
    assert overhead.status == Status.PASS and 0 < overhead.extra["ci_low"] <= overhead.extra["ci_high"]
    assert overhead.extra["rounds"] == 5 and overhead.extra["stopped"] == "5 rounds configured"
    assert next(r for r in rows if r.metric == "expected_overhead_ratio").value == pytest.approx(32 / 27)


def test_disabled_timing_is_not_run(tmp_path):
    """The runner writes the NOT_RUN row of a check turned off by its group (timing.enabled=false)."""
    from reportgen.checks.timing import check as timing
    from reportgen.commands.run import disabled_rows

    setup = prepare(compose_config("+model=granularity", "timing.enabled=false", user_conf=True))
    assert timing.CHECK.config == "timing" and not setup.config.timing.enabled
    assert [(r.check, r.status) for r in disabled_rows(timing.CHECK)] == [("warm-step time", "NOT_RUN")]


@pytest.mark.gpu
def test_timed_synchronizes_on_cuda():
    x = torch.randn(2048, 2048, device="cuda")
    ms = timed(lambda: [x @ x for _ in range(20)], torch.device("cuda"))
    assert ms > 0.5  # without synchronize the launch alone returns in microseconds


def test_an_interval_wider_than_the_target_is_a_warning_not_a_figure_to_trust():
    setup = prepare(
        compose_config(
            "+model=granularity",
            "timing.warmup_steps=0",
            "timing.measured_steps=4",
            "timing.bootstrap_samples=100",
            "timing.target_ci_half_width_pp=0",
            "timing.max_measure_seconds=0",
            user_conf=True,
        )
    )
    rows = warm_step_time(Run(setup))
    overhead = next(r for r in rows if r.role == Role.OVERHEAD)
    confidence = next(r for r in rows if r.role == Role.OVERHEAD_CI)
    assert overhead.extra["rounds"] == 4 and overhead.extra["stopped"].startswith("time budget")
    assert overhead.status == Status.INFO  # no deadline: the cost is reported, not judged
    assert confidence.status == Status.WARN and "too noisy to trust" in confidence.detail
    assert confidence.value == overhead.extra["ci_half_width_pp"] > 0 == confidence.threshold_value


def test_machine_load_warns_when_other_work_competes(monkeypatch):
    from reportgen.checks.timing import rows as timing_rows

    monkeypatch.setattr(timing_rows.os, "getloadavg", lambda: (torch.get_num_threads() + 2.5, 0.0, 0.0))
    row = timing_rows.machine_load_row()
    assert row.status == Status.WARN and row.metric == "load_average" and "inflated" in row.detail
    monkeypatch.setattr(timing_rows.os, "getloadavg", lambda: (torch.get_num_threads() + 0.2, 0.0, 0.0))
    assert timing_rows.machine_load_row().status == Status.PASS
