"""Instruments that leave no trace (issue 36, item 6): reportgen's memory tracker, FLOP and op counters are
TorchDispatchModes, under which torch.compile refuses a ``fullgraph=True`` function and then refuses it for
the rest of the process. A healthy model calling one inside its recomputed blocks must not be called FAIL:
the instrument's own row is INCONCLUSIVE with the reason, and every later check runs the compiled code."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from reportgen.errors import InstrumentRefused
from reportgen.memory.instrument import instrument
from reportgen.results import Status
from reportgen.results.raised import error_row, raised_status


def test_compiled_code_refused_under_the_instrument_runs_again_after_it():
    @torch.compile(fullgraph=True, backend="eager")
    def f(x):
        return torch.sin(x) * 2

    f(torch.randn(3))
    with pytest.raises(InstrumentRefused, match="the FLOP counter could not run this model"):
        with instrument("the FLOP counter"), FlopCounterMode(display=False):
            f(torch.randn(4))
    assert torch.equal(f(torch.ones(5)), torch.sin(torch.ones(5)) * 2)  # without the reset: RuntimeError


def test_an_instrument_refusal_is_an_inconclusive_row_never_an_error():
    row = error_row("warm-step memory", InstrumentRefused("the memory tracker could not run this model"), "plain")
    assert row.status == Status.INCONCLUSIVE and "could not run this model" in row.detail
    assert error_row("warm-step memory", RuntimeError("boom"), "recompute").status == Status.ERROR
    assert raised_status(InstrumentRefused("refused"), Status.WARN) == Status.WARN  # an advisory row stays one


def test_a_healthy_model_with_a_compiled_function_in_its_regions_is_never_called_fail(tmp_path):
    """The tracker refuses the compiled function: the advisory step-peak row stays a WARN (its own severity), so
    the claim holds (it was INCONCLUSIVE, exit 3, where any other tracker failure stayed a WARN)."""
    from conftest import run_pipeline

    code, frame = run_pipeline(tmp_path, "+model=compiled_block", user_conf=True)
    assert code == 0, frame[frame.status.isin(["FAIL", "ERROR", "INCONCLUSIVE"])][["check", "item"]].to_string()
    peak = frame[(frame.check == "warm-step memory") & (frame.role == "exception")]
    assert peak.empty or set(peak.status) == {"WARN"}, peak[["item", "status", "detail"]].to_string()
    assert not frame.status.isin(["FAIL", "ERROR"]).any()
    for check in ("gradient parity", "warm-step time", "task metrics"):  # after the memory tracker ran
        assert (frame[frame.check == check].status != "ERROR").all()
    why = frame[(frame.check == "warm-step memory") & (frame.role == "diagnosis")]  # the instrument, not the model
    assert code == 0 or why.rule.tolist() == ["reportgen's instrument refused"]
    html = (tmp_path / "report.html").read_text()
    assert "its rows are listed as they are" not in html  # the not-estimated step-peak row has its estimate_shape
