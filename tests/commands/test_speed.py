"""Predictable speed (issue 19, item 1): the ``threads`` setting, progress lines without a terminal,
the run-time estimate that refuses settings implying hours, and a timing check that never says
"too noisy" after "confidence target reached". No test here times anything (benchmarks/ does)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from conftest import compose_config, run_pipeline

from reportgen import progress, threads
from reportgen.checks.timing import check as timing
from reportgen.commands.validation import config_problems
from reportgen.errors import ExitCode
from reportgen.results import Status
from reportgen.training import duration
from reportgen.training.duration import Estimate, RunTooLong, format_duration, refuse_long_runs

# --------------------------------------------------------------------------- threads


@pytest.mark.parametrize(
    "cpus, cores, expected",
    [(1, 1, 1), (2, 2, 1), (2, 1, 1), (4, 2, 1), (8, 4, 2), (8, 8, 4), (64, 32, 4), (6, None, 3)],
)
def test_auto_is_half_the_physical_cores_between_1_and_the_cap(cpus, cores, expected):
    assert threads.auto_threads(cpus, cores) == expected


def test_resolve_threads_reads_the_setting_then_omp_num_threads_then_the_machine(monkeypatch):
    assert threads.resolve_threads(3, {}) == (3, "threads=3")
    assert threads.resolve_threads("2", {"OMP_NUM_THREADS": "5"}) == (2, "threads=2")  # the setting wins
    assert threads.resolve_threads("auto", {"OMP_NUM_THREADS": "5"}) == (5, "auto: OMP_NUM_THREADS=5")
    monkeypatch.setattr(threads, "available_cpus", lambda: 8)
    monkeypatch.setattr(threads, "physical_cores", lambda: 4)
    count, source = threads.resolve_threads("auto", {"OMP_NUM_THREADS": ""})
    assert count == 2 and "half of 4 physical cores of the 8 CPUs" in source


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_bad_threads_is_refused_naming_the_fix(bad):
    assert "threads=auto" in threads.threads_problem(bad)
    with pytest.raises(ValueError):
        threads.resolve_threads(bad, {})
    assert "threads=auto" in config_problems(compose_config("+model=ffn", f"threads={bad}"))


def test_apply_threads_sets_intra_op_and_survives_a_second_interop_call():
    before = torch.get_num_threads()
    try:
        first = threads.apply_threads(2, {})
        assert torch.get_num_threads() == 2 and first.intra_op == 2
        second = threads.apply_threads(1, {})  # inter-op may not be set twice: kept, no RuntimeError
        assert second.intra_op == 1 and second.inter_op == torch.get_num_interop_threads()
        assert second.describe().startswith("1 intra-op, ") and "(threads=1)" in second.describe()
    finally:
        torch.set_num_threads(before)


def test_the_run_states_its_threads_on_page_1(tmp_path):
    code, _ = run_pipeline(tmp_path, "+model=ffn", "threads=1")
    assert code == 0
    html = (tmp_path / "report.html").read_text()
    assert "torch CPU threads: 1 intra-op" in html and "(threads=1)" in html
    assert "<td>torch_threads</td><td>1 intra-op" in html  # the environment table, signed with the statement


# --------------------------------------------------------------------------- progress


def test_progress_without_a_terminal_writes_log_lines_with_rate_and_time_left(caplog, monkeypatch):
    monkeypatch.setattr(progress, "LOG_DELAY_S", 0.0)
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger="reportgen"):
        with progress.progress("plain seed 0", total=10, unit="ex", interactive=False) as bar:
            for _ in range(10):
                bar.update(1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress:")]
    assert lines and all("\r" not in line for line in lines)
    assert "plain seed 0" in lines[-1] and "10/10" in lines[-1] and "ex/s" in lines[-1]
    assert any("<" in line for line in lines)  # tqdm's "elapsed<left"


def test_a_short_phase_writes_no_progress_line(caplog):
    with caplog.at_level(logging.INFO, logger="reportgen"):
        with progress.progress("quick", total=3, interactive=False) as bar:
            bar.update(3)
    assert not [r for r in caplog.records if r.getMessage().startswith("progress:")]


# --------------------------------------------------------------------------- estimate before the run


def test_format_duration_picks_a_unit_people_read():
    assert [format_duration(s) for s in (45, 720, 3.2 * 3600, 41 * 86400, 3e12)] == [
        "45 s",
        "12 min",
        "3.2 h",
        "41 days",
        "9.5e+04 years",
    ]


def test_estimate_multiplies_the_timed_step_by_the_steps_the_settings_imply(setup, monkeypatch):
    s = setup(
        "+model=ffn",
        "parity.steps=1000",
        "budget.examples=3200",
        "budget.batch_size=16",
        "budget.seeds=[0,1]",
        "larger_batch.enabled=true",
    )
    monkeypatch.setattr(duration, "step_seconds", lambda setup, recompute, batch: 0.010 if recompute else 0.005)
    monkeypatch.setattr(duration, "evaluation_seconds", lambda setup: 0.1)
    fixed = {"copy_seconds": 0.2, "comparison_seconds": 0.03, "tracked_step_seconds": 0.07, "process_seconds": 4.0}
    for name, seconds in fixed.items():
        monkeypatch.setattr(duration, name, lambda *a, seconds=seconds: seconds)
    est = duration.estimate_run(s)
    assert est.phases["trajectory parity"] == pytest.approx(1000 * (3 * 0.005 + 0.010))  # plain twice, A/A, recompute
    warm = s.config.memory.warm_steps + 1
    assert est.phases["gradient, step and memory checks"] == pytest.approx(5 * 0.015 + 2 * warm * 0.07)
    # 3 + 3 + 4 (parity) + 5 (this estimate) + 6 (memory) + 2 (timing) + 2 × 2 seeds + search (2 × 4 doublings
    # from 16 to larger_batch.max_batch_size=4096, rounded up from log2 256 = 8) + 2 larger-batch seeds
    assert duration.twin_copies(s) == 3 + 3 + 4 + 5 + 6 + 2 + 4 + 2 * 8 + 2
    assert est.phases["twin copies"] == pytest.approx(duration.twin_copies(s) * 0.2)
    assert est.phases["comparisons"] == pytest.approx((2 + 6 + 1000 * 6) * 0.03)
    assert est.phases["so far"] == 4.0 and est.phases["report"] == duration.REPORT_SECONDS_NO_PDF
    evals = 3200 // 16 + 1  # SMALL: budget.eval_every=16, and one more at the start
    assert est.phases["task metrics"] == pytest.approx(2 * (200 * (0.005 + 0.010) + 2 * evals * 0.1))
    assert est.phases["larger-batch experiment"] == pytest.approx(2 * (200 * 0.010 + evals * 0.1))
    assert est.phases["warm-step time"] == pytest.approx(4 * 0.015)  # SMALL: 1 warm-up + 3 measured rounds
    assert "warm-step time" not in est.upper  # SMALL: timing.target_ci_half_width_pp=null, no adaptive rounds
    assert "parity.steps=1000" in est.drivers["trajectory parity"]


def test_settings_that_imply_hours_are_refused_with_the_estimate_and_the_override(setup, monkeypatch):
    s = setup("+model=ffn", "parity.steps=100000")
    monkeypatch.setattr(duration, "step_seconds", lambda setup, recompute, batch: 0.02)
    monkeypatch.setattr(duration, "evaluation_seconds", lambda setup: 0.0)
    for name in ("copy_seconds", "comparison_seconds", "tracked_step_seconds", "process_seconds"):
        monkeypatch.setattr(duration, name, lambda *a: 0.0)
    with pytest.raises(RunTooLong) as refused:
        refuse_long_runs(s)
    message = str(refused.value)
    assert "\n" not in message and "trajectory parity 2.2 h" in message and "parity.steps=100000" in message
    assert (
        "run.max_estimated_minutes=60" in message and "run.max_estimated_minutes=201" in message
    )  # 1.5 × the 133-min estimate: 4 × 100000 steps of 20 ms and the report (2 s without a PDF)


def test_the_pipeline_exits_2_before_any_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(duration, "step_seconds", lambda setup, recompute, batch: 0.02)
    monkeypatch.setattr(duration, "evaluation_seconds", lambda setup: 0.0)
    assert run_pipeline(tmp_path, "+model=ffn", "budget.examples=1000000000000")[0] == ExitCode.USAGE
    out = capsys.readouterr().out
    assert out.startswith("reportgen: cannot start: the settings imply a run of about") and "years" in out
    assert not (tmp_path / "results.partial.json").exists()


def test_no_limit_makes_no_estimate(setup, monkeypatch):
    s = setup("+model=ffn", "run.max_estimated_minutes=null")
    monkeypatch.setattr(duration, "step_seconds", lambda *a: pytest.fail("no step should be timed"))
    assert refuse_long_runs(s) is None


def test_user_code_that_raises_in_the_estimate_leaves_it_to_the_checks(setup, monkeypatch, caplog):
    s = setup("+model=ffn")

    def boom(*args):
        raise ValueError("evaluation exploded")

    monkeypatch.setattr(duration, "evaluation_seconds", boom)
    with caplog.at_level(logging.INFO, logger="reportgen"):
        assert refuse_long_runs(s) is None
    assert "no run-time estimate" in caplog.text and "exploded" not in caplog.text  # the checks report it, once


def test_estimate_describe_lists_the_longest_phase_first():
    est = Estimate({"a": 60.0, "b": 7200.0}, {"a": "x=1", "b": "y=2"})
    assert est.describe() == "about 2.0 h: b 2.0 h (y=2), a 60 s (x=1)" and est.minutes == pytest.approx(121)


# --------------------------------------------------------------------------- timing: no self-contradiction


@pytest.mark.parametrize("seed", range(12))
def test_stopping_on_the_target_always_reports_an_interval_within_it(seed):
    """The rule that stops measuring is the interval the report shows (before: a 500-sample
    bootstrap stopped, the 2000-sample one reported "too noisy ... (confidence target reached)")."""
    rng = np.random.default_rng(seed)
    plain = 10 + rng.exponential(0.3, 24)
    times = {"plain": list(plain), "recompute": list(plain * 1.2 * (1 + rng.normal(0, 0.04, 24)))}
    target = timing.ci_half_width_pp(times, 2000)  # exactly at the edge, where two bootstraps disagree most
    reached = timing.ci_target_reached(target, 2000)(times)
    row = timing.ci_width_row(overhead(times, 2000), target, "confidence target reached")
    assert reached and row.status == Status.PASS


def test_a_noisy_row_never_says_the_target_was_reached():
    times = {"plain": [10.0, 30.0, 12.0, 50.0], "recompute": [40.0, 11.0, 90.0, 13.0]}
    row = timing.ci_width_row(overhead(times, 500), 2.0, "confidence target reached")
    assert row.status == Status.WARN and "too noisy to trust" in row.detail and "target reached" not in row.detail
    row = timing.ci_width_row(overhead(times, 500), 2.0, "time budget of 10 s spent")
    assert "(time budget of 10 s spent)" in row.detail and "timing.max_measure_seconds" in row.detail


def overhead(times: dict[str, list[float]], samples: int):
    """The ``overhead`` row as ``warm_step_time`` leaves it (with its ``rounds``)."""
    row = timing.overhead_row(times, samples, None)
    row.extra["rounds"] = len(times["plain"])
    return row


def test_adaptive_timing_is_estimated_at_its_least_and_refused_at_its_cap(setup, monkeypatch):
    s = setup("+model=ffn", "timing.target_ci_half_width_pp=2", "timing.max_measure_seconds=3000")
    monkeypatch.setattr(duration, "step_seconds", lambda setup, recompute, batch: 0.01)
    monkeypatch.setattr(duration, "evaluation_seconds", lambda setup: 0.0)
    for name in ("copy_seconds", "comparison_seconds", "tracked_step_seconds", "process_seconds"):
        monkeypatch.setattr(duration, name, lambda *a: 0.0)
    est = duration.estimate_run(s)
    assert est.phases["warm-step time"] == pytest.approx(4 * 0.02)  # SMALL: 1 warm-up + 3 measured rounds
    assert est.upper["warm-step time"] == pytest.approx(0.02 + 3000)
    assert est.minutes < 1 < 50 < est.upper_minutes
    assert "warm-step time 0 s to 50 min" in est.describe()
    monkeypatch.setattr(duration, "estimate_run", lambda setup: est)
    with pytest.raises(RunTooLong):  # the limit (60 min) holds against the cap, not the least
        refuse_long_runs(setup("+model=ffn", "run.max_estimated_minutes=30"))
