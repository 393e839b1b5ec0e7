"""The summary table of a sweep: one row per job and check, the swept overrides, each job's headline
costs, the worst exit code, the Pareto front and the table printed on the console."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from reportgen.claim.rows import not_judged
from reportgen.config import GRADIENT_PARITY, STATE_PARITY, STEP_PARITY
from reportgen.report.render import headline_costs
from reportgen.results import Status, check_summary
from reportgen.results.frame import detectors

PARITY_CHECKS = (GRADIENT_PARITY, STEP_PARITY, STATE_PARITY)
#: A job's headline costs (:func:`job_costs`), columns of the summary.
COST_COLUMNS = ["saved_activation_share", "overhead_ratio", "overhead_ci_low", "overhead_ci_high"]
COST_COLUMNS += ["metric", "metric_abs_diff"]
SUMMARY_COLUMNS = [
    *("job", "overrides", "verdict", "not_judged", "detectors", "exit_code", "error", "check", "status", "required"),
    *COST_COLUMNS,
    "report",
]


def _override_pairs(overrides: Iterable[str]) -> dict[str, str]:
    """``["+model=ffn", "recompute=reentrant"]`` → ``{"model": "ffn", "recompute": "reentrant"}``."""
    return {key.lstrip("+~"): value for key, _, value in (str(text).partition("=") for text in overrides)}


def swept_keys(jobs: list[dict]) -> list[str]:
    """Override keys whose value differs between jobs (all keys when there is one job), in
    first-seen order: the columns of the summary."""
    pairs = [_override_pairs(j["overrides"]) for j in jobs]
    keys = list(dict.fromkeys(k for p in pairs for k in p))
    if len(jobs) <= 1:
        return keys
    return [k for k in keys if len({p.get(k) for p in pairs}) > 1]


def job_costs(frame: pd.DataFrame | None) -> dict[str, Any]:
    """Headline costs of one job: ``reportgen.report.render.headline_costs`` plus the largest
    per-seed |recompute - plain| held-out metric difference (``abs_diff_<metric>`` rows)."""
    out: dict[str, Any] = dict.fromkeys(COST_COLUMNS)
    if frame is None or frame.empty:
        return out
    costs = headline_costs(frame)
    if costs["memory"]:
        out["saved_activation_share"] = float(costs["memory"]["share"])
    if costs["time"]:
        out["overhead_ratio"] = float(costs["time"]["ratio"])
        for side in ("low", "high"):
            value = costs["time"][side]
            out[f"overhead_ci_{side}"] = None if value is None or pd.isna(value) else float(value)
    diffs = frame[frame.metric.astype(str).str.startswith("abs_diff_")]
    values = pd.to_numeric(diffs.value, errors="coerce").dropna()
    if len(values):
        out["metric"] = str(diffs.metric.iloc[0]).removeprefix("abs_diff_")
        out["metric_abs_diff"] = float(values.max())
    return out


def summary_frame(jobs: list[dict]) -> pd.DataFrame:
    """One row per job and check (columns :data:`SUMMARY_COLUMNS`, swept overrides inserted
    after ``job``); a job without results is one row with an empty ``check`` and its error. ``not_judged``: the
    quantities of the job's claim sentence no clause judges (``"; "``-joined; "" when every one is judged);
    ``detectors``: "" when the job's detector controls ran, else why its PASS rows are unproven
    (:func:`reportgen.results.frame.detectors`)."""
    keys = swept_keys(jobs)
    records = []
    for job in jobs:
        pairs = _override_pairs(job["overrides"])
        base = {
            "job": job["job"],
            **{k: pairs.get(k) for k in keys},
            "overrides": " ".join(job["overrides"]),
            "verdict": job["verdict"],
            "not_judged": "; ".join(not_judged(job["frame"])) if job["frame"] is not None else "",
            "detectors": detectors(job["frame"]) if job["frame"] is not None else "",
            "exit_code": job["exit_code"],
            "error": job["error"],
            **job_costs(job["frame"]),
            "report": f"{job['dir']}/report.html" if job["has_report"] else None,
        }
        frame = job["frame"]
        if frame is None or frame.empty:
            records.append({**base, "check": None, "status": None, "required": None})
            continue
        for check in check_summary(frame, job["required"]).to_dict("records"):
            records.append(
                {**base, "check": check["check"], "status": check["status"], "required": bool(check["required"])}
            )
    columns = ["job", *[k for k in keys if k not in SUMMARY_COLUMNS], *SUMMARY_COLUMNS[1:]]
    return pd.DataFrame.from_records(records, columns=columns)


def worst_code(jobs: list[dict]) -> int:
    """The sweep's exit code: the largest job code (DESIGN.md: "In a sweep, the worst job's code")."""
    return max((j["exit_code"] for j in jobs), default=0)


def pareto_front(jobs: pd.DataFrame) -> pd.DataFrame:
    """Configurations that hold and that no other holding one beats on both costs.

    Args:
        jobs: one row per job with ``verdict``, ``saved_activation_share`` (fraction, higher
            is better) and ``overhead_ratio`` (recompute/plain step time, lower is better).

    Returns:
        The non-dominated PASS rows, sorted by saved-activation share.
    """
    ok = jobs[(jobs.verdict == Status.PASS) & jobs.saved_activation_share.notna() & jobs.overhead_ratio.notna()]
    keep = []
    for i, row in ok.iterrows():
        dominated = (
            (ok.saved_activation_share >= row.saved_activation_share)
            & (ok.overhead_ratio <= row.overhead_ratio)
            & ((ok.saved_activation_share > row.saved_activation_share) | (ok.overhead_ratio < row.overhead_ratio))
        )
        if not dominated.any():
            keep.append(i)
    return ok.loc[keep].sort_values("saved_activation_share")


def job_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per job from the summary frame, with ``parity_failed`` (a parity check FAIL or ERROR)."""
    per_job = frame.drop_duplicates("job").set_index("job")
    parity = frame[frame.check.isin(PARITY_CHECKS) & frame.status.isin([Status.FAIL, Status.ERROR])].job.unique()
    per_job["parity_failed"] = per_job.index.isin(parity)
    return per_job.reset_index()


def console_table(frame: pd.DataFrame, code: int, where: Path) -> str:
    """The short table printed when a sweep ends: job, verdict, exit code, swept overrides, error."""
    jobs = job_table(frame)
    keys = list(frame.columns[1 : frame.columns.get_loc("overrides")])
    lines = [
        f"reportgen sweep: {int((jobs.verdict == Status.PASS).sum())} of {len(jobs)} jobs hold; exit code {code} "
        "(the worst job's)",
        f"  {'job':>4}  {'verdict':<12} {'exit':>4}  overrides",
    ]
    for row in jobs.to_dict("records"):
        swept = " ".join(f"{k}={row[k]}" for k in keys) or row["overrides"]
        error = f"  [{row['error']}]" if isinstance(row["error"], str) and row["error"] else ""
        error += (
            "  [the claim sentence is not judged]"
            if isinstance(row.get("not_judged"), str) and row["not_judged"]
            else ""
        )
        error += "  [detectors not proven]" if isinstance(row.get("detectors"), str) and row["detectors"] else ""
        lines.append(f"  {row['job']:>4}  {row['verdict']:<12} {row['exit_code']:>4}  {swept}{error[:200]}")
    lines.append(f"summary: {where}")
    return "\n".join(lines)
