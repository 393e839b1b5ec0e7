"""The end of a Hydra multirun: one summary (CSV, HTML, PDF, signed) and the worst job's exit code.

Each job writes its outcome into its own folder (``job.json``: exit code, verdict, overrides,
error) through :func:`recorded_job`. When every job has finished, Hydra calls the
``on_multirun_end`` hook of :class:`SweepSummary` (registered in ``conf/config.yaml`` under
``hydra.callbacks``) in the process that launched the sweep. It reads those files, never
process memory, so the summary and the exit code are the same under the basic launcher
(jobs in this process), joblib (worker processes) and submitit (local subprocesses or SLURM).

What it writes into the sweep directory (``hydra.sweep.dir``):

- ``summary.csv`` / ``summary.json``: one row per job and check, the swept overrides as
  columns, the job's verdict, exit code and error, and the headline costs
  (``reportgen.report.render.headline_costs``): saved-activation share, overhead ratio with its
  95% CI, largest held-out metric difference. A job with no results is one row with its error.
- ``summary.html`` / ``summary.pdf``: verdict matrix (jobs x checks), saving-vs-overhead
  scatter with parity failures marked, the Pareto front of configurations that hold, and a
  link to each job's report.
- with signing on: ``summary.dsse.json`` (an in-toto statement over the summary files and
  every job's ``job.json`` and ``statement.dsse.json``) and a PAdES-signed ``summary.pdf``.

The code, by concern: :mod:`~reportgen.sweep.record` (each job's ``job.json``),
:mod:`~reportgen.sweep.jobs` (reading a sweep folder), :mod:`~reportgen.sweep.table` (the summary
table, costs, Pareto front, console table), :mod:`~reportgen.sweep.render` (HTML, PDF, scatter),
:mod:`~reportgen.sweep.summary` (writing it), :mod:`~reportgen.sweep.signing` (signing it),
:mod:`~reportgen.sweep.callback` (the Hydra callback) and :mod:`~reportgen.sweep.cli` (the command).
Their public names are importable from here too (``reportgen.sweep.SweepSummary`` is the
``_target_`` in ``conf/config.yaml``; ``reportgen.sweep:main`` the console script).
"""

from reportgen.sweep.callback import SweepSummary, sweep_exit_code
from reportgen.sweep.cli import main
from reportgen.sweep.jobs import MISSING, job_dirs, load_jobs
from reportgen.sweep.record import JOB_FILE, VERDICT_BY_CODE, recorded_job
from reportgen.sweep.render import render_summary, scatter_svg, summary_view
from reportgen.sweep.signing import SUMMARY_DOCUMENT, SWEEP_PREDICATE_TYPE, sign_summary
from reportgen.sweep.summary import INCOMPLETE_MARK, SUMMARY_ENVELOPE, SUMMARY_FILES, SweepMismatch, summarize
from reportgen.sweep.table import (
    PARITY_CHECKS,
    SUMMARY_COLUMNS,
    console_table,
    job_costs,
    job_table,
    pareto_front,
    summary_frame,
    swept_keys,
    worst_code,
)

__all__ = [
    "INCOMPLETE_MARK",
    "JOB_FILE",
    "MISSING",
    "PARITY_CHECKS",
    "SUMMARY_COLUMNS",
    "SUMMARY_DOCUMENT",
    "SUMMARY_ENVELOPE",
    "SUMMARY_FILES",
    "SWEEP_PREDICATE_TYPE",
    "VERDICT_BY_CODE",
    "SweepMismatch",
    "SweepSummary",
    "console_table",
    "job_costs",
    "job_dirs",
    "job_table",
    "load_jobs",
    "main",
    "pareto_front",
    "recorded_job",
    "render_summary",
    "scatter_svg",
    "sign_summary",
    "summarize",
    "summary_frame",
    "summary_view",
    "sweep_exit_code",
    "swept_keys",
    "worst_code",
]
