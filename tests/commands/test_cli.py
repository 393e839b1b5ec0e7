"""The Hydra entry point as a user runs it: exit codes, messages, outputs (slow: subprocesses)."""

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import SMALL, TESTS, reportgen, run_dirs

pytestmark = pytest.mark.slow

#: Runs whose assertions read gradient parity only: the training-heavy checks are off and the verdict needs
#: gradient parity alone, so the exit code still says what it says with every check on (1 = gradient parity
#: failed). The full checklist through the command line runs in the first ffn run below.
PARITY_ONLY = (
    "verdict.required=[gradient parity]",
    "memory.enabled=false",
    "timing.enabled=false",
    "budget.enabled=false",
)


def test_unknown_model_exits_2_listing_models(tmp_path):
    proc = reportgen(tmp_path, "+model=nope")
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "ffn, gpt, hf_causal_lm, hf_gpt2, hf_llama, hf_masked_lm, mlp" in out and "Traceback" not in out


def test_targets_matching_nothing_exit_2_naming_classes(tmp_path):
    proc = reportgen(tmp_path, "+model=ffn", "recompute.targets=[Nothing]", "report.sign=false")
    assert proc.returncode == 2
    assert "FeedForwardBlock" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


def test_ffn_without_rng_preservation_fails_gradients_but_loss_passes_and_two_runs_never_share_a_folder(tmp_path):
    proc = reportgen(tmp_path, "+model=ffn", "recompute.preserve_rng_state=false", *SMALL, "report.pdf=true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (run,) = run_dirs(tmp_path)
    frame = pd.read_csv(run / "results.csv")
    status = frame.groupby("check").status.agg(set)
    assert "FAIL" in status["gradient parity"] and "FAIL" in status["optimizer-step parity"]
    assert frame[(frame.check == "gradient parity") & (frame["item"] == "loss")].status.item() == "PASS"
    for name in ("report.html", "report.pdf", "results.json"):
        assert (run / name).stat().st_size > 0
    assert json.loads((run / "results.json").read_text())[0]["check"] == "gradient parity"
    page_one = (run / "report.html").read_text()  # the CPU generator's state: entries that differ, no "difference"
    rng = frame[(frame.check == "state parity") & frame["item"].str.startswith("RNG") & (frame.status == "FAIL")]
    assert rng.detail.str.fullmatch(r"[1-9]\d* of its 5056 values differs?, where none may").all() and len(rng)
    assert re.search(r"\b[1-9]\d* of its 5056 values differs?, where none may \(atol=0 rtol=0\)", page_one)
    reportgen(tmp_path, "+model=ffn", *SMALL, *PARITY_ONLY)  # a second run from the same folder: a folder of its own
    assert len(run_dirs(tmp_path)) == 2


def test_user_model_from_own_config_dir(tmp_path):
    proc = reportgen(
        tmp_path,
        "--config-dir",
        str(TESTS / "user_conf"),
        "+model=frozen_input",
        "recompute=reentrant",
        *SMALL,
        *PARITY_ONLY,
        pythonpath=str(TESTS),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (run,) = run_dirs(tmp_path)
    frame = pd.read_csv(run / "results.csv")
    lost = frame[(frame.check == "gradient parity") & (frame.status == "FAIL")]
    grads = lost[lost.role == "param_grad"]
    assert grads["detail"].str.contains("None in the recompute run").all() and len(grads) == 4


def test_multirun_sweep_runs_every_job_and_exits_with_the_worst_code(tmp_path):
    proc = reportgen(tmp_path, "-m", "+model=ffn", "recompute.preserve_rng_state=true,false", *SMALL, *PARITY_ONLY)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    jobs = sorted(p.name for p in (tmp_path / "multirun").glob("*/*/*") if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0", "1"]
    assert proc.stdout.count("claim HOLDS") == 1 and proc.stdout.count("claim FAILS") == 1


def test_console_never_names_torch_internal_exceptions_and_the_log_keeps_them():
    """A torch.compile failure raises torch._subclasses' DataDependentOutputException: the console
    line says "an error inside torch" with the message; the record (for the log file) is unchanged."""
    import logging

    from torch._subclasses.fake_tensor import DataDependentOutputException

    from reportgen.commands.cli import OneLineExceptions
    from reportgen.errors import console_text

    try:
        raise DataDependentOutputException(torch_op := "aten._local_scalar_dense.default")
    except DataDependentOutputException:
        record = logging.makeLogRecord({"msg": "compile failed", "levelno": logging.ERROR, "exc_info": sys.exc_info()})
    line = OneLineExceptions(None, Path("run.log")).format(record)
    assert "DataDependentOutputException" not in line
    assert line.startswith("compile failed: an error inside torch:") and torch_op in line and "run.log" in line
    assert record.exc_info[0] is DataDependentOutputException  # the log file's handler still gets the type
    detail = "not run: torch.compile could not run the twins (DataDependentOutputException: x)"
    assert console_text(detail) == "not run: torch.compile could not run the twins (an error inside torch: x)"
    assert console_text("RuntimeError: y; torch.OutOfMemoryError") == "RuntimeError: y; torch.OutOfMemoryError"
