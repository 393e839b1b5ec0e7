"""Verify a sweep: its signed summary, every job it lists, and that the summary follows from the jobs.

A sweep's statement (``summary.dsse.json``, written by ``reportgen.sweep.summarize``) lists every
job's folder, exit code, verdict and the digest of the job's own statement. Verifying the sweep
folder checks, beyond the document itself (``reportgen.verify.common``):

- each job folder verifies as a run with the same key, and its statement is the one listed;
- each job's signed verdict agrees with the exit code and verdict the summary gives it;
- a job that exits 0, 1 or 3 signed its run (signing was on for the sweep); one that did not
  start or crashed is named in a NOTE;
- no job folder is on disk that the summary does not list, and none it lists is missing;
- the summary frame re-derived from the jobs' files (``reportgen.sweep.summary_frame``) equals
  the signed summary.json, byte for byte;
- the summary was not left incomplete by an interrupted write;
- the launch: the jobs re-derived from the signed ``multirun.yaml`` (Hydra's record of the
  launch, ``reportgen.trust.launch``) are the signed launch and exactly the jobs listed, each
  with its own number and overrides, and every signed job's statement names this launch (a
  job copied in from another sweep fails, named).
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from reportgen.files import sha256_file
from reportgen.results import frame_to_json
from reportgen.sweep import INCOMPLETE_MARK, SUMMARY_DOCUMENT, VERDICT_BY_CODE, job_dirs, load_jobs, summary_frame
from reportgen.trust.documents import ENVELOPE_NAME
from reportgen.trust.jobs import SIGNED_VERDICTS
from reportgen.trust.launch import LAUNCH_FILE, launch_differences, launch_record
from reportgen.verify.common import (
    Document,
    Verified,
    safe_relative,
    subject_digests,
    unlisted_files,
    verify_document_dir,
    verify_lone_pdf,
)
from reportgen.verify.outcome import FAIL, NOTE, Check, attempt, of_type, present, require
from reportgen.verify.run import verify_run


def check_sweep_predicate(predicate: dict) -> str:
    """A sweep's predicate lists at least one job, each with folder, exit code, verdict and statement digest."""
    jobs = of_type(predicate.get("jobs"), list, "the predicate lists no jobs")
    require(jobs, "the predicate lists no jobs")
    for job in jobs:
        require(
            isinstance(job, dict) and {"job", "dir", "exit_code", "verdict", "statement_sha256"} <= set(job),
            f"malformed job entry {job!r}",
        )
        require(
            isinstance(job["dir"], str) and safe_relative(job["dir"]), f"job folder {job['dir']!r} is outside the sweep"
        )
    require(isinstance(predicate.get("launch"), dict), f"the predicate records no launch (Hydra's {LAUNCH_FILE})")
    return f"sweep of {len(jobs)} jobs, worst exit code {predicate.get('exit_code')}"


#: A sweep: summary.pdf over summary.json.
SUMMARY = Document.of("sweep", SUMMARY_DOCUMENT, check_sweep_predicate)


def _check_job(sweep_dir: Path, job: dict, public_key: ec.EllipticCurvePublicKey, entry: dict) -> Check:
    """One line for one listed job: its run verifies, is the listed statement, and agrees with the summary.
    ``entry`` receives ``signed_launch``, the ``sweep`` its verified statement names."""
    name = f"job {job['job']} ({job['dir']}/)"

    def run() -> str:
        folder = sweep_dir / job["dir"]
        require(folder.is_dir(), "its folder is missing")
        if job["statement_sha256"] is None:
            require(
                job["exit_code"] not in SIGNED_VERDICTS,
                f"exit code {job['exit_code']} means its checks ran, but the summary lists no signed statement",
            )
            return f"not signed: it did not run its checks (exit code {job['exit_code']}, {job['verdict']})"
        found = verify_run(folder, public_key)
        entry["notes"] = [Check(NOTE, f"{job['dir']}/: {c.name}", c.detail) for c in found.checks if c.status == NOTE]
        failed = [c for c in found.checks if c.status == FAIL]
        require(not failed, f"its run does not verify: {failed[0].line if failed else ''}")
        require(
            sha256_file(folder / ENVELOPE_NAME) == job["statement_sha256"],
            "its statement is not the one the summary lists (a swapped or replaced job)",
        )
        statement = present(found.statement, "its run has no verified statement")
        entry["signed_launch"] = statement["predicate"].get("sweep")
        signed = statement["predicate"]["verdict"]
        expected = VERDICT_BY_CODE.get(job["exit_code"])
        require(
            signed == job["verdict"] == expected,
            f"the summary says {job['verdict']} (exit code {job['exit_code']}), its signed run says {signed}",
        )
        checked = sum(c.status != NOTE for c in found.checks)
        return f"run verifies ({checked} checks), claim {signed}, exit code {job['exit_code']}"

    return attempt(name, run)


def _job_folders(sweep_dir: Path, jobs: list[dict]) -> str:
    """Every job folder on disk is listed in the signed summary (an added job would be unvouched for)."""
    listed = {job["dir"] for job in jobs}
    on_disk = {p.relative_to(sweep_dir).as_posix() for p in job_dirs(sweep_dir)}
    extra = sorted(on_disk - listed)
    require(not extra, f"job folder(s) {', '.join(extra)} are not in the signed summary")
    return f"{len(on_disk)} job folders, each listed"


def _not_covered(sweep_dir: Path, digests: dict, jobs: list[dict]) -> list[Check]:
    """NOTE lines for what the sweep's statement does not vouch for outside its jobs' own folders
    (a job's folder is vouched for by the job's statement; its own NOTE lines name the rest)."""
    listed = {job["dir"] for job in jobs}
    own = (SUMMARY.pdf, SUMMARY.envelope, INCOMPLETE_MARK)
    grouped: dict[str, list[str]] = {}
    for name, kind in unlisted_files(sweep_dir, digests, own=own):
        if any(name.startswith(f"{d}/") for d in listed):
            continue
        top = name.split("/")[0] + ("/" if "/" in name else "")
        grouped.setdefault(top, []).append(kind)
    return [
        Check(
            NOTE,
            f"not covered: {top}",
            (f"{len(kinds)} files, " if top.endswith("/") else kinds[0])
            + "not in the sweep's statement and in no job's folder; nothing vouches for it",
        )
        for top, kinds in grouped.items()
    ]


def _launch(sweep_dir: Path, predicate: dict, digests: dict, entries: list[dict]) -> str:
    """The signed multirun.yaml re-derives the signed launch, and the listed jobs are exactly its jobs."""
    require(LAUNCH_FILE in digests, f"the statement does not cover {LAUNCH_FILE}, Hydra's record of the launch")
    record = launch_record(sweep_dir)
    require(record["sha256"] == digests[LAUNCH_FILE], f"{LAUNCH_FILE} is not the signed one")
    require(record == predicate["launch"], f"the signed launch does not follow from {LAUNCH_FILE}")
    differences = launch_differences(record, entries)
    require(not differences, "; ".join(differences))
    swept = ", ".join(f"{k} ({len(v)} values)" for k, v in record["swept"].items()) or "nothing swept"
    return f"{record['job_count']} jobs re-derived from {LAUNCH_FILE} ({swept}), each listed once as launched"


def _rederived(sweep_dir: Path, summary: bytes | None) -> str:
    """The summary re-derived from the jobs' files equals the signed summary.json."""
    require(summary is not None, "not checked: no signed summary.json")
    derived = frame_to_json(summary_frame(load_jobs(sweep_dir))).encode()
    require(
        derived == summary,
        "summary.json does not follow from the jobs' signed files "
        "(a job's outcome or results differ from what the summary states)",
    )
    return "summary.json = re-derived from the jobs' files"


def verify_sweep(sweep_dir: Path, public_key: ec.EllipticCurvePublicKey) -> Verified:
    """A sweep folder: the signed summary, every job, and the summary re-derived (module docstring)."""
    sweep_dir = Path(sweep_dir)
    found = verify_document_dir(sweep_dir, public_key, SUMMARY, note_unlisted=False)
    if (sweep_dir / INCOMPLETE_MARK).exists():
        said = f"{INCOMPLETE_MARK} is present: the summary was interrupted; rewrite it with python -m reportgen.sweep "
        found.checks.append(Check(FAIL, "summary complete", f"{said}summarize {sweep_dir}"))
    if found.statement is None:
        return found
    predicate, digests, summary = found.statement["predicate"], subject_digests(found.statement), found.data
    jobs = predicate["jobs"]
    entries = [{"job": j["job"], "dir": j["dir"], "overrides": j.get("overrides", [])} for j in jobs]
    found.checks += [_check_job(sweep_dir, job, public_key, entry) for job, entry in zip(jobs, entries)]
    found.checks += [
        attempt("job folders", lambda: _job_folders(sweep_dir, jobs)),
        attempt("summary from jobs", lambda: _rederived(sweep_dir, summary)),
        attempt("launch", lambda: _launch(sweep_dir, predicate, digests, entries)),
    ]
    found.checks += [note for entry in entries for note in entry.pop("notes", [])]
    found.checks += _not_covered(sweep_dir, digests, jobs)
    return found


def verify_summary(data: bytes, public_key: ec.EllipticCurvePublicKey) -> Verified:
    """A lone summary.pdf: the document's own checks; the jobs need the sweep folder (a NOTE says so)."""
    said = "jobs listed with their statements' digests; a lone summary.pdf cannot show them: verify the sweep folder "
    said += "to check every job"
    return verify_lone_pdf(data, public_key, SUMMARY, "jobs", lambda st: f"{len(st['predicate']['jobs'])} {said}")
