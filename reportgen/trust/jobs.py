"""Before a sweep summary is signed: every job is one the launch made, and says what its signed run says.

``reportgen.sweep.summarize`` calls :func:`job_problems` before it writes anything it signs. The
summary states each job's verdict from its ``job.json`` and its rows from its ``results.json``;
both are plain files anyone who can write to the sweep folder can edit. So, with a key, each
job that ran its checks must hold a statement signed by that key whose ``results.json`` subject
is the file on disk and whose verdict is the one ``job.json`` states, and the set of jobs must
be the launch's (:func:`reportgen.trust.launch.launch_differences`). ``reportgen.verify`` then
checks everything again, PDFs and re-judged rows included.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.files import sha256_file
from reportgen.trust.launch import LaunchError, launch_differences, launch_record
from reportgen.trust.signing import ENVELOPE_NAME, PREDICATE_TYPE, RESULTS_NAME, decode_b64, sslib_public_key

#: Exit codes of jobs that ran their checks and therefore signed their run (DESIGN.md "Exit code").
SIGNED_CODES = (0, 1, 3)
#: What a signed job's exit code says about its claim (``reportgen.sweep.VERDICT_BY_CODE``).
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


def signed_job(sweep_dir: Path, job: dict[str, Any], public_key: ec.EllipticCurvePublicKey) -> tuple[dict, list[str]]:
    """One job against its signed statement: ``(the job with "signed_launch" when signed, problems)``."""
    folder, where = Path(sweep_dir) / job["dir"], f"job {job['job']} ({job['dir']}/)"
    entry = {k: job[k] for k in ("job", "dir", "overrides")}
    envelope = folder / ENVELOPE_NAME
    if not envelope.is_file():
        if job["exit_code"] in SIGNED_CODES:
            return entry, [
                f"{where}: job.json says exit code {job['exit_code']} ({job['verdict']}), which only a "
                "signed run gives, and the folder holds no signed statement"
            ]
        return entry, []
    try:
        statement = signed_statement(envelope, public_key)
    except ValueError as exc:
        return entry, [f"{where}: {exc}"]
    predicate = statement["predicate"]
    entry["signed_launch"] = predicate.get("sweep")
    digests = {s["name"]: s["digest"]["sha256"] for s in statement.get("subject", [])}
    results = folder / RESULTS_NAME
    if not results.is_file() or digests.get(RESULTS_NAME) != sha256_file(results):
        return entry, [f"{where}: its {RESULTS_NAME} is not the one its signed statement vouches for"]
    signed = predicate.get("verdict")
    if SIGNED_VERDICTS.get(job["exit_code"]) != signed or job["verdict"] != signed:
        return entry, [
            f"{where}: job.json says {job['verdict']} (exit code {job['exit_code']}), its signed run says {signed}"
        ]
    return entry, []


def job_problems(
    sweep_dir: str | Path, jobs: list[dict[str, Any]], public_key: ec.EllipticCurvePublicKey | None
) -> tuple[dict | None, list[str]]:
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
