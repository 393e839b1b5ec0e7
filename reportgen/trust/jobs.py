"""Before a sweep summary is signed: every job is one the launch made, and says what its signed run says.

``reportgen.sweep.summarize`` calls :func:`job_problems` before it writes anything it signs. The
summary states each job's verdict from its ``job.json`` and its rows from its ``results.json``;
both files are plain files anyone who can write to the sweep folder can edit, so with a key
each job that ran its checks is verified as a run (``reportgen.verify.run``) and its ``job.json``
must agree with its signed statement, and the set of jobs must be the launch's
(:func:`reportgen.trust.launch.launch_differences`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from ..signing import ENVELOPE_NAME
from .launch import LaunchError, launch_differences, launch_record

#: Exit codes of jobs that ran their checks and therefore signed their run (DESIGN.md "Exit code").
SIGNED_CODES = (0, 1, 3)
#: What a job's exit code says about its claim (``reportgen.sweep.VERDICT_BY_CODE``, signed codes only).
SIGNED_VERDICTS = {0: "PASS", 1: "FAIL", 3: "INCONCLUSIVE"}


def signed_job(sweep_dir: Path, job: dict[str, Any], public_key: ec.EllipticCurvePublicKey) -> tuple[dict, list[str]]:
    """One job's statement, verified: ``(the job with "signed_launch" when it has one, problems)``."""
    from ..verify.run import verify_run

    folder, where = Path(sweep_dir) / job["dir"], f"job {job['job']} ({job['dir']}/)"
    entry = {k: job[k] for k in ("job", "dir", "overrides")}
    if not (folder / ENVELOPE_NAME).is_file():
        if job["exit_code"] in SIGNED_CODES:
            return entry, [f"{where}: job.json says exit code {job['exit_code']} ({job['verdict']}), which only a "
                           "signed run gives, and the folder holds no signed statement"]
        return entry, []
    found = verify_run(folder, public_key)
    failed = [c.line for c in found.checks if c.status == "FAIL"]
    if failed or found.statement is None:
        return entry, [f"{where}: its run does not verify ({failed[0] if failed else 'no statement'})"]
    predicate = found.statement["predicate"]
    entry["signed_launch"] = predicate.get("sweep")
    signed = predicate["verdict"]
    if SIGNED_VERDICTS.get(job["exit_code"]) != signed or job["verdict"] != signed:
        return entry, [f"{where}: job.json says {job['verdict']} (exit code {job['exit_code']}), its signed run "
                       f"says {signed}"]
    return entry, []


def job_problems(sweep_dir: str | Path, jobs: list[dict[str, Any]],
                 public_key: ec.EllipticCurvePublicKey | None) -> tuple[dict | None, list[str]]:
    """The launch record and every reason the jobs found cannot be summarised under a signature.

    Args:
        sweep_dir: the sweep folder.
        jobs: ``reportgen.sweep.load_jobs``.
        public_key: the signer's public key; ``None`` (an UNSIGNED summary) checks only the job set.

    Returns:
        ``(launch record or None, problems)``; no problems means the summary may be signed.
    """
    problems: list[str] = []
    entries = []
    for job in jobs:
        if public_key is None:
            entries.append({k: job[k] for k in ("job", "dir", "overrides")})
            continue
        entry, found = signed_job(Path(sweep_dir), job, public_key)
        entries.append(entry)
        problems += found
    try:
        launch = launch_record(sweep_dir)
    except LaunchError as exc:
        return None, [str(exc), *problems]
    return launch, launch_differences(launch, entries) + problems
