"""Each check is a phase with a peak of its own: the run's peak names the phase that reached it (issue 43 item 4)."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import run_pipeline

from reportgen.config import MEMORY
from reportgen.memory import device_peak
from reportgen.memory.device_peak import phase_peak, run_host_peak
from reportgen.results import Role

MIB = 1024**2
linux = pytest.mark.skipif(sys.platform != "linux", reason="the high-water mark is reset through /proc")


@linux
def test_a_phase_after_a_big_one_has_its_own_smaller_peak():
    with phase_peak("big", torch.device("cpu")) as big:
        held = torch.ones(300 * MIB // 4)  # 300 MiB touched
        del held
    with phase_peak("small", torch.device("cpu")) as small:
        torch.ones(MIB // 4)
    assert big.exact and small.exact
    assert big.bytes - big.resident_before >= 290 * MIB, (big.bytes, big.resident_before)
    assert small.bytes - small.resident_before < 100 * MIB, (small.bytes, small.resident_before)
    assert run_host_peak() >= big.bytes  # the run's own peak keeps the big phase after the reset


def test_without_the_reset_a_phase_peak_is_stated_as_a_bound(monkeypatch):
    monkeypatch.setattr(device_peak, "reset_host_peak", lambda: False)
    with phase_peak("unresettable", torch.device("cpu")) as peak:
        pass
    assert not peak.exact and peak.bytes > 0


@linux
def test_the_run_peak_names_its_phase_and_every_check_has_a_peak_row(tmp_path):
    code, frame = run_pipeline(tmp_path, "+model=ffn", "controls.enabled=false")
    assert code == 0
    memory = frame[frame.check == MEMORY]
    run_peak = memory[memory.item == "run peak"].iloc[0]
    phases = memory[memory.item.str.startswith("peak during ")]
    assert {"peak during gradient parity", "peak during warm-step memory"} <= set(phases.item)
    top = phases.loc[phases.value.idxmax()]
    assert run_peak["phase"] == top["item"].removeprefix("peak during ")
    assert f"reached in {run_peak['phase']}" in run_peak.detail
    assert run_peak.value >= phases.value.max() and set(phases.role) == {Role.NOTE}
