"""Before a sweep summary is signed: every job is one the launch made, and says what its signed run says.

``job.json`` and ``results.json`` are plain files anyone who can write to the sweep folder can edit, so
``reportgen.sweep.summarize`` calls :func:`job_problems` before it signs a summary made from them;
``reportgen.verify`` checks everything again, PDFs and re-judged rows included.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.files import sha256_file
from reportgen.trust.documents import ENVELOPE_NAME, PREDICATE_TYPE, RESULTS_NAME
from reportgen.trust.launch import LaunchError, launch_differences, launch_record
from reportgen.trust.statement import decode_b64, sslib_public_key

#: What the exit code of a job that ran its checks, and so signed its run, says of its claim (DESIGN.md "Exit
#: code"; the rest of ``reportgen.sweep.VERDICT_BY_CODE`` never signs).
SIGNED_VERDICTS = {0: "PASS", 1: "FAIL", 3: "INCONCLUSIVE"}


def signed_statement(envelope_path: Path, public_key: ec.EllipticCurvePublicKey) -> dict:
    """The run statement in ``envelope_path``, when its DSSE signature verifies with ``public_key``.

    Raises:
        ValueError: not a DSSE envelope, not signed by this key, or not a run statement.
    """
    from securesystemslib.dsse import Envelope

    try:
        raw = json.loads(envelope_path.read_bytes())
        Envelope.from_dict(copy.deepcopy(raw)).verify([sslib_public_key(public_key)], 1)
        statement = json.loads(decode_b64(raw["payload"]))
    except Exception as exc:  # noqa: BLE001 - any malformed or forged envelope: one reason
        raise ValueError(f"its statement does not verify with this key ({type(exc).__name__})") from None
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise ValueError(f"its statement is not a run statement ({statement.get('predicateType')!r})")
    return statement


def signed_job(sweep_dir: Path, job: dict[str, Any], entry: dict, public_key: ec.EllipticCurvePublicKey) -> list[str]:
    """One job against its signed statement: the problems; ``entry`` gets ``signed_launch`` when it is signed."""
    folder, where = Path(sweep_dir) / job["dir"], f"job {job['job']} ({job['dir']}/)"
    envelope = folder / ENVELOPE_NAME
    if not envelope.is_file():
        if job["exit_code"] in SIGNED_VERDICTS:
            return [
                f"{where}: job.json says exit code {job['exit_code']} ({job['verdict']}), which only a "
                "signed run gives, and the folder holds no signed statement"
            ]
        return []
    try:
        statement = signed_statement(envelope, public_key)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    predicate = statement["predicate"]
    entry["signed_launch"] = predicate.get("sweep")
    digests = {s["name"]: s["digest"]["sha256"] for s in statement.get("subject", [])}
    results = folder / RESULTS_NAME
    if not results.is_file() or digests.get(RESULTS_NAME) != sha256_file(results):
        return [f"{where}: its {RESULTS_NAME} is not the one its signed statement vouches for"]
    signed = predicate.get("verdict")
    if SIGNED_VERDICTS.get(job["exit_code"]) != signed or job["verdict"] != signed:
        return [f"{where}: job.json says {job['verdict']} (exit code {job['exit_code']}), its signed run says {signed}"]
    return []


def job_problems(
    sweep_dir: str | Path, jobs: list[dict[str, Any]], public_key: ec.EllipticCurvePublicKey | None
) -> tuple[dict | None, list[str]]:
    """``(launch record or None, problems)``: every reason the jobs (``reportgen.sweep.load_jobs``) cannot be
    summarised under a signature; no problems means the summary may be signed. ``public_key`` is the signer's;
    ``None`` (an UNSIGNED summary) checks only the job set."""
    entries = [{k: job[k] for k in ("job", "dir", "overrides")} for job in jobs]
    problems: list[str] = []
    for job, entry in zip(jobs, entries):
        problems += signed_job(Path(sweep_dir), job, entry, public_key) if public_key is not None else []
    try:
        launch = launch_record(sweep_dir)
    except LaunchError as exc:
        return None, [str(exc), *problems]
    return launch, launch_differences(launch, entries) + problems
