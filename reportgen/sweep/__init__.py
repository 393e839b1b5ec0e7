"""The end of a Hydra multirun: one summary (CSV, HTML, PDF, signed) and the worst job's exit code.

What a sweep writes, and why from files alone (the same under every launcher): docs/sweeps.md. By concern:
:mod:`~reportgen.sweep.record` (each job's ``job.json``), :mod:`~reportgen.sweep.jobs` (reading a sweep
folder), :mod:`~reportgen.sweep.table` (the summary table, costs, Pareto front, console table),
:mod:`~reportgen.sweep.render` (HTML, PDF, scatter), :mod:`~reportgen.sweep.summary` (writing and
signing it) and :mod:`~reportgen.sweep.callback` (the Hydra callback ``reportgen.sweep.SweepSummary``, the
``_target_`` in ``conf/config.yaml``, and the command, ``reportgen.sweep:main``). What other packages use is importable
from here too.
"""

from reportgen.sweep.callback import SweepSummary, main, sweep_exit_code
from reportgen.sweep.jobs import job_dirs, load_jobs
from reportgen.sweep.record import VERDICT_BY_CODE, recorded_job
from reportgen.sweep.summary import INCOMPLETE_MARK, SUMMARY_DOCUMENT, summarize
from reportgen.sweep.table import job_costs, summary_frame

__all__ = ["INCOMPLETE_MARK", "SUMMARY_DOCUMENT", "VERDICT_BY_CODE", "SweepSummary", "job_costs", "job_dirs"]
__all__ += ["load_jobs", "main", "recorded_job", "summarize", "summary_frame", "sweep_exit_code"]
