"""Reading a sweep folder: its job folders and each job's outcome, results frame and required checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from reportgen.checks import required_names
from reportgen.claim import claim_required
from reportgen.errors import ExitCode
from reportgen.results import Status, check_summary, frame_from_json
from reportgen.sweep.record import JOB_FILE

#: A folder with Hydra's ``.hydra/`` but no ``job.json``: the job was killed (OOM, SLURM time
#: limit) or never finished. It counts as crashed.
MISSING = "NO_OUTCOME"


def job_dirs(sweep_dir: Path) -> list[Path]:
    """Job folders of a sweep: those holding ``job.json`` or Hydra's ``.hydra/overrides.yaml``."""
    found = {p.parent for p in sweep_dir.rglob(JOB_FILE)}
    found |= {p.parent.parent for p in sweep_dir.rglob(".hydra/overrides.yaml")}
    return sorted(found - {sweep_dir})


def load_jobs(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """Every job of a sweep with its outcome, results frame and required checks, in job order.

    Reads only files: ``job.json``, ``results.json`` (else ``results.partial.json``: a job
    that stopped early still shows what it measured) and ``.hydra/config.yaml`` for
    ``verdict.required``. A folder without ``job.json`` is a job that never reported
    (killed, timed out): verdict ``NO_OUTCOME``, exit code 70, overrides from
    ``.hydra/overrides.yaml``.

    Returns:
        ``[{"job", "dir", "overrides", "exit_code", "verdict", "error", "frame", "required"}]``;
        ``frame`` is ``None`` when the job left no results.
    """
    sweep_dir = Path(sweep_dir)
    jobs: list[dict[str, Any]] = []
    for folder in job_dirs(sweep_dir):
        record_path, hydra_dir = folder / JOB_FILE, folder / ".hydra"
        if record_path.exists():
            record = json.loads(record_path.read_text())
        else:
            overrides = OmegaConf.load(hydra_dir / "overrides.yaml") if (hydra_dir / "overrides.yaml").exists() else []
            record = {
                "overrides": list(overrides),
                "exit_code": ExitCode.BUG,
                "verdict": MISSING,
                "error": f"no {JOB_FILE} in {folder.name}/: the job was killed or did not finish "
                "(see its log, or the launcher's, e.g. .submitit/)",
            }
        required: list[str] = []
        if (hydra_dir / "config.yaml").exists():
            job_cfg = OmegaConf.load(hydra_dir / "config.yaml")
            required = required_names(OmegaConf.select(job_cfg, "verdict.required", default=None))
            required += claim_required(job_cfg.get("claim"))  # the job's release claim, when it had one
        found = [folder / n for n in ("results.json", "results.partial.json") if (folder / n).exists()]
        frame = frame_from_json(found[0].read_text()) if found else None
        error, code = record.get("error"), record["exit_code"]
        if not error and frame is not None and code in (1, 3):  # the checks that fail it, or that make it INCONCLUSIVE
            summary = check_summary(frame[frame.status != "FLAGGED"], required)
            failing = summary.required & summary.status.isin([Status.FAIL, Status.ERROR, "NOT_RUN"])
            bad = summary[failing if code == 1 else summary.status == Status.INCONCLUSIVE]
            said = "claim fails: " if code == 1 else "cannot be judged: "
            error = said + ", ".join(f"{c} {s}" for c, s in zip(bad.check, bad.status))
        number = record.get("job")
        number = number if number is not None else (folder.name if folder.name.isdigit() else len(jobs))
        job = {"job": int(number), "dir": folder.relative_to(sweep_dir).as_posix()}
        job |= {"overrides": list(record.get("overrides", [])), "exit_code": int(code), "verdict": record["verdict"]}
        job |= {"error": error, "frame": frame, "required": required, "has_report": (folder / "report.html").exists()}
        jobs.append(job)
    return sorted(jobs, key=lambda j: j["job"])
