"""In each job of a multirun: run it and write its outcome into its folder (``job.json``).

The sweep summary (:mod:`reportgen.sweep.summary`) reads only these files, never process memory, so
it is the same under every launcher.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reportgen.errors import ExitCode
from reportgen.files import atomic_write

log = logging.getLogger("reportgen")

JOB_FILE = "job.json"
#: What a job's exit code says about its claim (DESIGN.md "Exit code").
VERDICT_BY_CODE = {
    0: "PASS",
    1: "FAIL",
    2: "NOT_STARTED",
    3: "INCONCLUSIVE",
    int(ExitCode.BUG): "CRASHED",
    130: "INTERRUPTED",
    143: "INTERRUPTED",
}


class _Tee(io.TextIOBase):
    """Writes to the real stream and remembers the text (for the job's error line)."""

    def __init__(self, stream):
        self.stream, self.buffer_text = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.buffer_text.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _job_identity() -> dict[str, Any]:
    """Hydra's view of the running job: number, id and task overrides (``{}`` outside a multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return {}
    return {
        "job": int(hydra_cfg.job.num),
        "job_id": str(hydra_cfg.job.get("id") or ""),
        "overrides": list(hydra_cfg.overrides.task),
    }


def recorded_job(out_dir: str | Path, job: Callable[[], int]) -> int:
    """Run one job and, in a multirun, write its outcome into ``out_dir/job.json``.

    The outcome is ``{"job", "job_id", "overrides", "exit_code", "verdict", "error",
    "seconds"}``; ``error`` is the last ``reportgen:`` line the job printed when it did not
    hold (the reason it could not start), or the exception of a crash. An exception inside
    ``job`` (reportgen itself failed) is logged with its traceback and becomes exit code 70,
    so one crashing job does not stop the sweep: the summary lists it. ``out_dir`` is the job's folder
    (``hydra.runtime.output_dir``); ``job`` runs the job and returns its exit code, which this returns.
    """
    identity = _job_identity()
    if not identity:  # a single run: nothing to summarise, keep the old behaviour exactly
        return job()
    start, tee, error = time.perf_counter(), _Tee(sys.stdout), None
    sys.stdout = tee
    try:
        code = job()
    except Exception as exc:  # a crash is one job's outcome, not the sweep's end
        log.exception("job crashed")
        code = ExitCode.BUG
        error = f"{type(exc).__name__}: {exc}".strip()
        print(f"reportgen: job crashed ({error.splitlines()[0]}); traceback in the job log in {out_dir}")
    finally:
        sys.stdout = tee.stream
    if error is None and code not in (0, 1):
        lines = [line for line in tee.buffer_text.getvalue().splitlines() if line.startswith("reportgen:")]
        error = lines[-1].removeprefix("reportgen:").strip() if lines else f"exit code {code}"
    outcome = {**identity, "exit_code": int(code), "verdict": VERDICT_BY_CODE.get(code, "CRASHED"), "error": error}
    outcome["seconds"] = round(time.perf_counter() - start, 3)
    atomic_write(Path(out_dir) / JOB_FILE, json.dumps(outcome, indent=1) + "\n")
    return code
