"""The end of a Hydra multirun: one summary (CSV, HTML, PDF, signed) and the worst job's exit code.

What a sweep writes, and why from files alone (the same under every launcher): docs/sweeps.md. By concern:
:mod:`~reportgen.sweep.record` (each job's ``job.json``), :mod:`~reportgen.sweep.jobs` (reading a sweep
folder), :mod:`~reportgen.sweep.table` (the summary table, costs, Pareto front, console table),
:mod:`~reportgen.sweep.render` (HTML, PDF, scatter), :mod:`~reportgen.sweep.summary` (writing and
signing it), :mod:`~reportgen.sweep.callback` (the Hydra callback
``reportgen.sweep.SweepSummary``, the ``_target_`` in ``conf/config.yaml``) and :mod:`~reportgen.sweep.cli`
(the command, ``reportgen.sweep:main``). Their public names are importable from here too.
"""

from reportgen.sweep.callback import SweepSummary, sweep_exit_code
from reportgen.sweep.cli import main
from reportgen.sweep.jobs import MISSING, job_dirs, load_jobs
from reportgen.sweep.record import JOB_FILE, VERDICT_BY_CODE, recorded_job
from reportgen.sweep.render import render_summary, scatter_svg, summary_view
from reportgen.sweep.summary import (
    INCOMPLETE_MARK,
    SUMMARY_DOCUMENT,
    SUMMARY_ENVELOPE,
    SUMMARY_FILES,
    SWEEP_PREDICATE_TYPE,
    SweepMismatch,
    sign_summary,
    summarize,
)
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
