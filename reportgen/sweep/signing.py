"""Signing a sweep's summary: an in-toto statement over the summary files, the launch record and
every job's ``job.json`` and signed statement (``summary.dsse.json``) and a PAdES-signed summary.pdf."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reportgen.ci.junit import JUNIT_NAME
from reportgen.files import sha256_file
from reportgen.sweep.record import JOB_FILE
from reportgen.trust.documents import DocumentSpec
from reportgen.trust.signing import ENVELOPE_NAME, SigningKey, sign

#: in-toto predicate type of the sweep summary's statement.
SWEEP_PREDICATE_TYPE = "https://reportgen.invalid/attestation/recompute-sweep/v1"
#: A sweep: summary.pdf over summary.json (read by ``reportgen.verify.sweep`` too).
SUMMARY_DOCUMENT = DocumentSpec.named("summary", SWEEP_PREDICATE_TYPE)


def sign_summary(
    sweep_dir: Path,
    jobs: list[dict[str, Any]],
    code: int,
    created: str,
    command: str,
    launch: dict[str, Any] | None,
    key: SigningKey,
) -> None:
    """Sign the summary just written into ``sweep_dir`` (``summary.dsse.json``, summary.pdf signed).

    Args:
        sweep_dir: ``hydra.sweep.dir``, holding the summary files and ``multirun.yaml``.
        jobs: ``reportgen.sweep.jobs.load_jobs``'s records.
        code: the sweep's exit code (the worst job's).
        created: the summary's time stamp (``meta["created"]``).
        command: the sweep's command line.
        launch: the launch record re-derived from ``multirun.yaml`` (``reportgen.trust.launch``).
        key: the signing key.
    """
    signed = [j for j in jobs if (sweep_dir / j["dir"] / ENVELOPE_NAME).exists()]
    predicate = {
        "exit_code": code,
        "created": created,
        "command": command,
        "launch": launch,
        "signer": {"publicKeySha256": key.fingerprint},
        "jobs": [_job_entry(sweep_dir, j) for j in jobs],
    }
    subjects = [
        "summary.csv",
        "summary.json",
        "summary.html",
        JUNIT_NAME,
        "multirun.yaml",
        *[f"{j['dir']}/{ENVELOPE_NAME}" for j in signed],
        *[f"{j['dir']}/{JOB_FILE}" for j in jobs],
    ]
    sign(
        sweep_dir,
        SUMMARY_DOCUMENT,
        predicate,
        key,
        f"reportgen sweep summary; worst job exit code {code}",
        subjects,
    )


def _job_entry(sweep_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
    """What the sweep's statement says of one job: its outcome and the SHA-256 of its run's signed
    statement (``None`` for a job that left none)."""
    envelope = sweep_dir / job["dir"] / ENVELOPE_NAME
    return {
        "job": job["job"],
        "dir": job["dir"],
        "overrides": job["overrides"],
        "exit_code": job["exit_code"],
        "verdict": job["verdict"],
        "error": job["error"],
        "statement_sha256": sha256_file(envelope) if envelope.exists() else None,
    }
