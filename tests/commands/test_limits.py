"""No check can keep a run alive past its deadline or memory ceiling (reportgen/limits.py)."""

from __future__ import annotations

import sys
import time

import pytest
from conftest import run_pipeline

from reportgen.limits import GIB, CheckLimitExceeded, limited, rss_bytes


def test_a_body_that_never_returns_is_stopped_at_the_deadline():
    start = time.monotonic()
    with pytest.raises(CheckLimitExceeded) as stopped:
        with limited("gradient parity", timeout_s=0.5, max_rss_gib=None, poll_s=0.05):
            while True:
                time.sleep(0.01)
    assert 0.5 <= time.monotonic() - start < 3
    assert stopped.value.limit == "timeout_s" and "checks.timeout_s=0.5" in stopped.value.message


def test_except_exception_inside_a_check_cannot_swallow_the_stop():
    """A check's own ``except Exception`` (run_twin) must not turn the stop into one more row."""
    swallowed = []
    with pytest.raises(CheckLimitExceeded):
        with limited("x", timeout_s=0.3, max_rss_gib=None, poll_s=0.05):
            try:
                while True:
                    time.sleep(0.01)
            except Exception:  # noqa: BLE001
                swallowed.append(True)
    assert swallowed == []


def test_an_import_in_progress_finishes_before_the_stop(tmp_path, monkeypatch):
    """A module half-executed when the stop hit stayed broken for every later check (torch importing
    sympy: "module 'sympy' has no attribute 'printing'"): the stop waits for the import to finish."""
    (tmp_path / "slow_import_module.py").write_text(
        "import time\nstart = time.monotonic()\nwhile time.monotonic() - start < 0.6:\n    time.sleep(0.01)\nFINISHED = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_import_module", raising=False)
    with pytest.raises(CheckLimitExceeded):
        with limited("x", timeout_s=0.1, max_rss_gib=None, poll_s=0.02):
            import slow_import_module  # noqa: F401 - the import is the subject

            while True:
                time.sleep(0.01)
    assert sys.modules["slow_import_module"].FINISHED


def test_a_body_that_ends_right_after_a_slow_import_is_still_stopped(tmp_path, monkeypatch):
    """The deadline passed during the import; the body ends before the next signal: the overrun is
    raised as the body ends, never forgiven."""
    (tmp_path / "slow_import_then_done.py").write_text(
        "import time\nstart = time.monotonic()\nwhile time.monotonic() - start < 1.0:\n    time.sleep(0.01)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_import_then_done", raising=False)
    with pytest.raises(CheckLimitExceeded) as stopped:  # signals at 0.3, 0.6, 0.9 s land in the import; the next, 1.2 s
        with limited("x", timeout_s=0.1, max_rss_gib=None, poll_s=0.3):
            import slow_import_then_done  # noqa: F401 - the import is the subject
    assert stopped.value.limit == "timeout_s" and "slow_import_then_done" in sys.modules


def test_memory_past_the_ceiling_is_stopped():
    ceiling = (rss_bytes() + 64 * 2**20) / GIB  # 64 MiB above what the process holds now
    hoard = []
    with pytest.raises(CheckLimitExceeded) as stopped:
        with limited("task metrics", timeout_s=30, max_rss_gib=ceiling, poll_s=0.02):
            while True:
                hoard.append(bytearray(8 * 2**20))
                time.sleep(0.005)
    hoard.clear()
    assert stopped.value.limit == "max_rss_gib" and "past checks.max_rss_gib" in stopped.value.message


def test_a_body_within_its_limits_runs_untouched():
    with limited("x", timeout_s=5, max_rss_gib=None):
        value = sum(range(1000))
    assert value == 499500


@pytest.mark.slow
def test_a_region_that_never_returns_ends_as_error_rows_and_the_run_finishes(tmp_path):
    start = time.monotonic()
    code, frame = run_pipeline(tmp_path, "+model=never_returns", "checks.timeout_s=0.5", user_conf=True)
    assert time.monotonic() - start < 120
    assert code in (1, 3)  # the claim fails (or cannot be judged); never a hang
    stopped = frame[frame["item"] == "stopped at checks.timeout_s"]
    assert "gradient parity" in set(stopped.check) and (stopped.status == "ERROR").all()
    assert stopped.detail.str.contains("never returns").all()
    why = frame[(frame.role == "diagnosis") & (frame.check == "gradient parity")].iloc[0]  # not "returned a tensor"
    assert why["rule"] == "stopped at a limit" and "raise checks.timeout_s" in why["fix"]
    assert (tmp_path / "report.html").exists()
