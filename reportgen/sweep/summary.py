"""Writing a sweep's summary: read every job, refuse a folder that is not its launch, write the
summary files under an incomplete mark, sign them (an in-toto statement over the summary files, the launch
record and every job's ``job.json`` and signed statement, and a PAdES-signed summary.pdf)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from reportgen.ci.junit import JUNIT_NAME, sweep_junit_xml
from reportgen.files import atomic_write, sha256_file
from reportgen.report.metadata import report_time
from reportgen.sweep.jobs import load_jobs
from reportgen.sweep.record import JOB_FILE
from reportgen.sweep.render import render_summary
from reportgen.sweep.table import summary_frame, swept_keys, worst_code
from reportgen.trust import signing
from reportgen.trust.documents import ENVELOPE_NAME, DocumentSpec
from reportgen.trust.jobs import job_problems
from reportgen.trust.keys import load_signing_key, signature_label

#: in-toto predicate type of the sweep summary's statement.
SWEEP_PREDICATE_TYPE = "https://reportgen.invalid/attestation/recompute-sweep/v1"
#: A sweep: summary.pdf over summary.json (read by ``reportgen.verify.sweep`` too).
SUMMARY_DOCUMENT = DocumentSpec.named("summary", SWEEP_PREDICATE_TYPE)

#: The summary's envelope, and the mark left while a summary is being written (a summary that
#: still has it was interrupted; ``python -m reportgen.sweep summarize DIR`` writes it again).
SUMMARY_ENVELOPE, INCOMPLETE_MARK = SUMMARY_DOCUMENT.envelope, "summary.incomplete"
#: Every file a summary consists of (removed before a summary is written again).
SUMMARY_FILES: tuple[str, ...] = ("summary.csv", "summary.json", "summary.html", "summary.pdf", "summary.unsigned.pdf")
SUMMARY_FILES += (SUMMARY_ENVELOPE, JUNIT_NAME)


class SweepMismatch(Exception):
    """The jobs in a sweep folder are not the ones its launch made, or do not say what their signed
    runs say; ``problems`` names each difference, and the summary is not written."""

    def __init__(self, sweep_dir: Path, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"{sweep_dir} is not summarised: {len(problems)} difference(s) from its launch and its "
            "jobs' signed runs:\n" + "\n".join(f"  - {p}" for p in problems)
        )


def summarize(
    sweep_dir: str | Path,
    sign: bool = False,
    key_path: str | None = None,
    pdf: bool = True,
    title: str = "Activation recomputation sweep",
    command: str = "",
    rewrite: bool = False,
) -> tuple[pd.DataFrame, int]:
    """Read a finished sweep folder and write its summary (and signature); the callback's work.

    Args:
        sweep_dir: ``hydra.sweep.dir``.
        sign, key_path: ``report.sign`` / ``report.key_path`` of the sweep.
        pdf: ``report.pdf``: also write summary.pdf.
        title: heading of the summary.
        command: the sweep's command line, shown in the summary.
        rewrite: remove an earlier (or interrupted) summary first; otherwise one that exists is
            refused (``FileExistsError``), as outputs never overwrite.

    While it writes, ``summary.incomplete`` marks the folder; it is removed last, so a summary
    that was interrupted stays marked (``reportgen.verify`` fails it).

    Returns:
        ``(summary frame, worst job exit code)``.

    Raises:
        reportgen.trust.keys.SigningError: signing is on and there is no usable key.
        reportgen.files.OutputWriteError: a summary file could not be written (disk full, ...).
        SweepMismatch: the jobs on disk are not the jobs the launch made (``multirun.yaml``), or
            (with a key) a job's run does not verify or its job.json disagrees with its signed
            run; nothing is written.
    """
    sweep_dir = Path(sweep_dir)
    key = load_signing_key(sign, key_path)
    jobs = load_jobs(sweep_dir)
    launch, problems = job_problems(sweep_dir, jobs, key.public_key if key else None)
    if problems:
        raise SweepMismatch(sweep_dir, problems)
    for name in (*SUMMARY_FILES, INCOMPLETE_MARK) if rewrite else ():
        (sweep_dir / name).unlink(missing_ok=True)
    mark = sweep_dir / INCOMPLETE_MARK
    atomic_write(
        mark,
        f"this summary is being written or was interrupted; write it again with\n"
        f"  python -m reportgen.sweep summarize {sweep_dir}\n",
    )
    code = worst_code(jobs)
    frame = summary_frame(jobs)
    meta = {"title": title, "created": report_time(), "sweep_dir": str(sweep_dir), "exit_code": code}
    meta |= {"signature": signature_label(key), "command": command, "swept": swept_keys(jobs)}
    render_summary(frame, meta, sweep_dir, pdf=pdf)
    atomic_write(sweep_dir / JUNIT_NAME, sweep_junit_xml(jobs, f"reportgen sweep ({sweep_dir.name})", swept_keys(jobs)))
    if key is not None:  # summary.dsse.json (with the launch re-derived from multirun.yaml), summary.pdf signed
        predicate = {"exit_code": code, "created": str(meta["created"]), "command": command, "launch": launch}
        predicate |= {"signer": {"publicKeySha256": key.fingerprint}, "jobs": [_job_entry(sweep_dir, j) for j in jobs]}
        subjects = ["summary.csv", "summary.json", "summary.html", JUNIT_NAME, "multirun.yaml"]
        subjects += [f"{j['dir']}/{ENVELOPE_NAME}" for j in jobs if (sweep_dir / j["dir"] / ENVELOPE_NAME).exists()]
        subjects += [f"{j['dir']}/{JOB_FILE}" for j in jobs]
        reason = f"reportgen sweep summary; worst job exit code {code}"
        signing.sign(sweep_dir, SUMMARY_DOCUMENT, predicate, key, reason, subjects)
    mark.unlink()
    return frame, code


def _job_entry(sweep_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
    """What the sweep's statement says of one job: its outcome and the SHA-256 of its run's signed
    statement (``None`` for a job that left none)."""
    envelope = sweep_dir / job["dir"] / ENVELOPE_NAME
    entry = {k: job[k] for k in ("job", "dir", "overrides", "exit_code", "verdict", "error")}
    return entry | {"statement_sha256": sha256_file(envelope) if envelope.exists() else None}
