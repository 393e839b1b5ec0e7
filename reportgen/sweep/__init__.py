"""The end of a Hydra multirun: one summary (CSV, HTML, PDF, signed) and the worst job's exit code.

Each job writes its outcome into its own folder (``job.json``: exit code, verdict, overrides,
error) through :func:`recorded_job`. When every job has finished, Hydra calls the
``on_multirun_end`` hook of :class:`SweepSummary` (registered in ``conf/config.yaml`` under
``hydra.callbacks``) in the process that launched the sweep. It reads those files, never
process memory, so the summary and the exit code are the same under the basic launcher
(jobs in this process), joblib (worker processes) and submitit (local subprocesses or SLURM).

What it writes into the sweep directory (``hydra.sweep.dir``):

- ``summary.csv`` / ``summary.json``: one row per job and check, the swept overrides as
  columns, the job's verdict, exit code and error, and the headline costs
  (``reportgen.report.render.headline_costs``): saved-activation share, overhead ratio with its
  95% CI, largest held-out metric difference. A job with no results is one row with its error.
- ``summary.html`` / ``summary.pdf``: verdict matrix (jobs x checks), saving-vs-overhead
  scatter with parity failures marked, the Pareto front of configurations that hold, and a
  link to each job's report.
- with signing on: ``summary.dsse.json`` (an in-toto statement over the summary files and
  every job's ``job.json`` and ``statement.dsse.json``) and a PAdES-signed ``summary.pdf``.
"""

from __future__ import annotations

import io
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from reportgen.checks import required_names
from reportgen.checks.plots import finish_axes, to_svg
from reportgen.ci.junit import JUNIT_NAME, sweep_junit_xml
from reportgen.claim import claim_required
from reportgen.config import GRADIENT_PARITY, STATE_PARITY, STEP_PARITY
from reportgen.errors import ExitCode
from reportgen.files import OutputWriteError, sha256_file
from reportgen.report.metadata import report_time, rerun_command
from reportgen.report.render import environment, headline_costs, write_pdf
from reportgen.results import ERROR, FAIL, PASS, atomic_write, check_summary, frame_from_json, frame_to_json
from reportgen.trust.jobs import job_problems
from reportgen.trust.signing import ENVELOPE_NAME, SigningError, load_signing_key, sign_document, signature_label

log = logging.getLogger("reportgen")

JOB_FILE = "job.json"
#: Exit code of a job in which reportgen itself raised (DESIGN.md "Exit code"); the log names the traceback.
#: What a job's exit code says about its claim (DESIGN.md "Exit code").
VERDICT_BY_CODE = {
    0: "PASS",
    1: "FAIL",
    2: "NOT_STARTED",
    3: "INCONCLUSIVE",
    int(ExitCode.BUG): "CRASHED",
    130: "INTERRUPTED",
    143: "INTERRUPTED",
}
#: A folder with Hydra's ``.hydra/`` but no ``job.json``: the job was killed (OOM, SLURM time
#: limit) or never finished. It counts as crashed.
MISSING = "NO_OUTCOME"
PARITY_CHECKS = (GRADIENT_PARITY, STEP_PARITY, STATE_PARITY)
#: in-toto predicate type of the sweep summary's statement.
SWEEP_PREDICATE_TYPE = "https://reportgen.invalid/attestation/recompute-sweep/v1"
SUMMARY_COLUMNS = [
    "job",
    "overrides",
    "verdict",
    "exit_code",
    "error",
    "check",
    "status",
    "required",
    "saved_activation_share",
    "overhead_ratio",
    "overhead_ci_low",
    "overhead_ci_high",
    "metric",
    "metric_abs_diff",
    "report",
]

#: The summary's envelope, and the mark left while a summary is being written (a summary that
#: still has it was interrupted; ``python -m reportgen.sweep summarize DIR`` writes it again).
SUMMARY_ENVELOPE, INCOMPLETE_MARK = "summary.dsse.json", "summary.incomplete"
#: Every file a summary consists of (removed before a summary is written again).
SUMMARY_FILES = (
    "summary.csv",
    "summary.json",
    "summary.html",
    "summary.pdf",
    "summary.unsigned.pdf",
    SUMMARY_ENVELOPE,
    JUNIT_NAME,
)

_last_sweep: dict[str, Any] = {}


class SweepMismatch(Exception):
    """The jobs in a sweep folder are not the ones its launch made, or do not say what their signed
    runs say; ``problems`` names each difference, and the summary is not written."""

    def __init__(self, sweep_dir: Path, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"{sweep_dir} is not summarised: {len(problems)} difference(s) from its launch and its "
            "jobs' signed runs:\n" + "\n".join(f"  - {p}" for p in problems)
        )


# --------------------------------------------------------------------------- in each job


class _Tee(io.TextIOBase):
    """Writes to the real stream and remembers the text (for the job's error line)."""

    def __init__(self, stream):
        self.stream, self.buffer_text = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.buffer_text.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def _job_identity() -> dict[str, Any]:
    """Hydra's view of the running job: number, id and task overrides (``{}`` outside a multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return {}
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return {}
    return {
        "job": int(hydra_cfg.job.num),
        "job_id": str(hydra_cfg.job.get("id") or ""),
        "overrides": list(hydra_cfg.overrides.task),
    }


def recorded_job(out_dir: str | Path, job: Callable[[], int]) -> int:
    """Run one job and, in a multirun, write its outcome into ``out_dir/job.json``.

    The outcome is ``{"job", "job_id", "overrides", "exit_code", "verdict", "error",
    "seconds"}``; ``error`` is the last ``reportgen:`` line the job printed when it did not
    hold (the reason it could not start), or the exception of a crash. An exception inside
    ``job`` (reportgen itself failed) is logged with its traceback and becomes exit code 70,
    so one crashing job does not stop the sweep: the summary lists it.

    Args:
        out_dir: the job's folder (``hydra.runtime.output_dir``).
        job: runs the job and returns its exit code.

    Returns:
        The job's exit code.
    """
    identity = _job_identity()
    if not identity:  # a single run: nothing to summarise, keep the old behaviour exactly
        return job()
    start, tee, error = time.perf_counter(), _Tee(sys.stdout), None
    sys.stdout = tee
    try:
        code = job()
    except Exception as exc:  # noqa: BLE001 - a crash is one job's outcome, not the sweep's end
        log.exception("job crashed")
        code = ExitCode.BUG
        error = f"{type(exc).__name__}: {exc}".strip()
        print(f"reportgen: job crashed ({error.splitlines()[0]}); traceback in the job log in {out_dir}")
    finally:
        sys.stdout = tee.stream
    if error is None and code not in (0, 1):
        lines = [line for line in tee.buffer_text.getvalue().splitlines() if line.startswith("reportgen:")]
        error = lines[-1].removeprefix("reportgen:").strip() if lines else f"exit code {code}"
    outcome = {
        **identity,
        "exit_code": int(code),
        "verdict": VERDICT_BY_CODE.get(code, "CRASHED"),
        "error": error,
        "seconds": round(time.perf_counter() - start, 3),
    }
    atomic_write(Path(out_dir) / JOB_FILE, json.dumps(outcome, indent=1) + "\n")
    return code


# --------------------------------------------------------------------------- reading the sweep


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
    jobs = []
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
        frame = None
        for name in ("results.json", "results.partial.json"):
            if (folder / name).exists():
                frame = frame_from_json((folder / name).read_text())
                break
        error = record.get("error")
        if not error and frame is not None and record["exit_code"] == 1:
            summary = check_summary(frame[frame.status != "FLAGGED"], required)
            bad = summary[summary.required & summary.status.isin([FAIL, ERROR, "NOT_RUN"])]
            error = "claim fails: " + ", ".join(f"{c} {s}" for c, s in zip(bad.check, bad.status))
        number = record.get("job")
        if number is None:
            number = int(folder.name) if folder.name.isdigit() else len(jobs)
        jobs.append(
            {
                "job": int(number),
                "dir": folder.relative_to(sweep_dir).as_posix(),
                "overrides": list(record.get("overrides", [])),
                "exit_code": int(record["exit_code"]),
                "verdict": record["verdict"],
                "error": error,
                "frame": frame,
                "required": required,
                "has_report": (folder / "report.html").exists(),
            }
        )
    return sorted(jobs, key=lambda j: j["job"])


def _override_pairs(overrides: Iterable[str]) -> dict[str, str]:
    """``["+model=ffn", "recompute=reentrant"]`` → ``{"model": "ffn", "recompute": "reentrant"}``."""
    pairs = {}
    for text in overrides:
        key, _, value = str(text).partition("=")
        pairs[key.lstrip("+~")] = value
    return pairs


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
    out = {
        "saved_activation_share": None,
        "overhead_ratio": None,
        "overhead_ci_low": None,
        "overhead_ci_high": None,
        "metric": None,
        "metric_abs_diff": None,
    }
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
    after ``job``); a job without results is one row with an empty ``check`` and its error."""
    keys = swept_keys(jobs)
    records = []
    for job in jobs:
        pairs = _override_pairs(job["overrides"])
        base = {
            "job": job["job"],
            **{k: pairs.get(k) for k in keys},
            "overrides": " ".join(job["overrides"]),
            "verdict": job["verdict"],
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
    ok = jobs[(jobs.verdict == PASS) & jobs.saved_activation_share.notna() & jobs.overhead_ratio.notna()]
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


# --------------------------------------------------------------------------- rendering


def _none(value: Any) -> Any:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def job_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per job from the summary frame, with ``parity_failed`` (a parity check FAIL or ERROR)."""
    per_job = frame.drop_duplicates("job").set_index("job")
    parity = frame[frame.check.isin(PARITY_CHECKS) & frame.status.isin([FAIL, ERROR])].job.unique()
    per_job["parity_failed"] = per_job.index.isin(parity)
    return per_job.reset_index()


def scatter_svg(jobs: pd.DataFrame, front: pd.DataFrame) -> str:
    """Saved-activation share (x, %) vs overhead ratio (y, with its 95% CI) per job; holds,
    fails and parity failures marked apart; the Pareto front of holding jobs as a step line."""
    from matplotlib.figure import Figure

    measured = jobs[jobs.saved_activation_share.notna() & jobs.overhead_ratio.notna()].copy()
    fig = Figure(figsize=(7.5, 3.4))
    ax = fig.subplots()
    dense = len(measured) > 40  # rasterize point layers of big sweeps: small, fast PDFs
    groups = [
        ("holds", measured.verdict == PASS, dict(color="#0a7d2e", marker="o")),
        (
            "fails (cost or task check)",
            (measured.verdict != PASS) & ~measured.parity_failed,
            dict(color="#d0621b", marker="s"),
        ),
        ("parity failure", measured.parity_failed, dict(color="#b01c1c", marker="x")),
    ]
    for label, mask, style in groups:
        part = measured[mask]
        if part.empty:
            continue
        low = (part.overhead_ratio - part.overhead_ci_low.fillna(part.overhead_ratio)).clip(lower=0)
        high = (part.overhead_ci_high.fillna(part.overhead_ratio) - part.overhead_ratio).clip(lower=0)
        ax.errorbar(
            part.saved_activation_share * 100,
            part.overhead_ratio,
            yerr=[low, high],
            ls="none",
            ms=5,
            elinewidth=0.8,
            capsize=2,
            label=label,
            rasterized=dense,
            **style,
        )
    if len(front):
        ax.step(
            front.saved_activation_share * 100,
            front.overhead_ratio,
            where="post",
            color="#0a7d2e",
            lw=1,
            ls="--",
            label="Pareto front (holds)",
        )
    if len(measured) <= 30:
        for _, row in measured.iterrows():
            ax.annotate(
                str(row.job),
                (row.saved_activation_share * 100, row.overhead_ratio),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
    if measured.empty:
        ax.text(0.5, 0.5, "no job measured both costs", ha="center", va="center", transform=ax.transAxes)
    finish_axes(
        fig,
        ax,
        "saved activations, % of the plain twin's (higher is better)",
        "step-time overhead ratio (lower is better)",
    )
    return to_svg(fig)


def summary_view(frame: pd.DataFrame, meta: dict, link_base: str, link_file: str) -> dict:
    """What ``templates/summary.html.j2`` reads: jobs, the verdict matrix, scatter, Pareto front.

    Args:
        frame: :func:`summary_frame`.
        meta: ``{"title", "created", "sweep_dir", "exit_code", "signature", "command", "swept"}``.
        link_base: prefix of links to job reports (``""``: relative, in the HTML and in the PDF).
        link_file: ``"report.html"`` or ``"report.pdf"``.
    """
    jobs = job_table(frame)
    front = pareto_front(jobs)
    checks = list(dict.fromkeys(c for c in frame.check if isinstance(c, str) and c))
    status = {(j, c): s for j, c, s in zip(frame.job, frame.check, frame.status) if isinstance(c, str)}
    rows = []
    for job in jobs.to_dict("records"):
        job = {k: _none(v) for k, v in job.items()}
        report = job["report"]
        job["link"] = f"{link_base}{report.removesuffix('report.html')}{link_file}" if report else None
        job["cells"] = [status.get((job["job"], c)) for c in checks]
        job["pareto"] = job["job"] in set(front.job)
        job["swept"] = " ".join(f"{k}={job.get(k)}" for k in meta["swept"]) or job["overrides"]
        rows.append(job)
    holding = sum(1 for r in rows if r["verdict"] == PASS)
    return {
        "meta": meta,
        "jobs": rows,
        "checks": checks,
        "holding": holding,
        "failures": [r for r in rows if r["error"]],
        "scatter": scatter_svg(jobs, front),
        "front": sorted((r for r in rows if r["pareto"]), key=lambda r: r["saved_activation_share"]),
    }


def render_summary(frame: pd.DataFrame, meta: dict, out_dir: Path, pdf: bool = True) -> dict[str, Path]:
    """Write summary.csv, summary.json, summary.html (and summary.pdf, PDF/A-3b with
    summary.json attached) into the sweep folder.

    Raises:
        FileExistsError: a summary exists already in ``out_dir``.
    """
    template = environment().get_template("summary.html.j2")
    out_dir = Path(out_dir)
    table = frame_to_json(frame)
    paths = {
        "csv": atomic_write(out_dir / "summary.csv", frame.to_csv(index=False)),
        "json": atomic_write(out_dir / "summary.json", table),
    }
    paths["html"] = atomic_write(
        out_dir / "summary.html", template.render(**summary_view(frame, meta, "", "report.html"))
    )
    if pdf:
        html = template.render(**summary_view(frame, meta, "", "report.pdf"))  # relative: no path of this machine
        attached = ("summary.json", table.encode(), "Data", "The sweep summary this document was rendered from.")
        paths["pdf"] = atomic_write(
            out_dir / "summary.pdf", write_pdf(html, meta["created"], [attached], relative_links=True)
        )
    return paths


def console_table(frame: pd.DataFrame, code: int, where: Path) -> str:
    """The short table printed when a sweep ends: job, verdict, exit code, swept overrides, error."""
    jobs = job_table(frame)
    keys = list(frame.columns[1 : frame.columns.get_loc("overrides")])
    lines = [
        f"reportgen sweep: {int((jobs.verdict == PASS).sum())} of {len(jobs)} jobs hold; exit code {code} "
        "(the worst job's)",
        f"  {'job':>4}  {'verdict':<12} {'exit':>4}  overrides",
    ]
    for row in jobs.to_dict("records"):
        swept = " ".join(f"{k}={row[k]}" for k in keys) or row["overrides"]
        error = f"  [{row['error']}]" if isinstance(row["error"], str) and row["error"] else ""
        lines.append(f"  {row['job']:>4}  {row['verdict']:<12} {row['exit_code']:>4}  {swept}{error[:200]}")
    lines.append(f"summary: {where}")
    return "\n".join(lines)


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
        reportgen.trust.signing.SigningError: signing is on and there is no usable key.
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
    meta = {
        "title": title,
        "created": report_time(),
        "sweep_dir": str(sweep_dir),
        "exit_code": code,
        "signature": signature_label(key),
        "command": command,
        "swept": swept_keys(jobs),
    }
    render_summary(frame, meta, sweep_dir, pdf=pdf)
    junit = sweep_junit_xml(jobs, f"reportgen sweep ({sweep_dir.name})", swept_keys(jobs))  # one case per job
    atomic_write(sweep_dir / JUNIT_NAME, junit)
    if key is not None:
        statements = [f"{j['dir']}/{ENVELOPE_NAME}" for j in jobs if (sweep_dir / j["dir"] / ENVELOPE_NAME).exists()]
        predicate = {
            "exit_code": code,
            "created": meta["created"],
            "command": command,
            "launch": launch,
            "signer": {"publicKeySha256": key.fingerprint},
            "jobs": [
                {
                    "job": j["job"],
                    "dir": j["dir"],
                    "overrides": j["overrides"],
                    "exit_code": j["exit_code"],
                    "verdict": j["verdict"],
                    "error": j["error"],
                    "statement_sha256": (
                        sha256_file(sweep_dir / j["dir"] / ENVELOPE_NAME)
                        if (sweep_dir / j["dir"] / ENVELOPE_NAME).exists()
                        else None
                    ),
                }
                for j in jobs
            ],
        }
        subjects = [
            "summary.csv",
            "summary.json",
            "summary.html",
            JUNIT_NAME,
            "multirun.yaml",
            *statements,
            *[f"{j['dir']}/{JOB_FILE}" for j in jobs],
        ]
        sign_document(
            sweep_dir,
            "summary",
            subjects,
            predicate,
            SWEEP_PREDICATE_TYPE,
            key,
            f"reportgen sweep summary; worst job exit code {code}",
        )
    mark.unlink()
    return frame, code


class SweepSummary(Callback):
    """Hydra callback: at the end of a multirun, summarise the sweep and remember its exit code.

    Registered in ``conf/config.yaml`` (``hydra.callbacks.sweep_summary``). It runs in the
    process that launched the sweep, after the launcher returned, and reads only the files
    the jobs wrote, so it works with every launcher. A summary that cannot be written is
    logged; the exit code still comes from the jobs.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the summary into ``hydra.sweep.dir``, print the console table, set the exit code."""
        sweep_dir = Path(str(config.hydra.sweep.dir))
        _last_sweep.clear()
        try:
            frame, code = summarize(
                sweep_dir,
                sign=bool(config.report.sign),
                key_path=config.report.key_path,
                pdf=bool(config.report.pdf),
                title=f"{config.report.title}: sweep",
                command=rerun_command(),
            )
            _last_sweep["code"] = code
            print(console_table(frame, code, sweep_dir / "summary.html"))
        except KeyboardInterrupt:
            print(
                f"reportgen: the sweep summary was interrupted and is marked incomplete; write it again with "
                f"python -m reportgen.sweep summarize {sweep_dir}",
                flush=True,
            )
            raise
        except (SigningError, OutputWriteError, SweepMismatch) as exc:
            jobs = load_jobs(sweep_dir) if sweep_dir.exists() else []
            _last_sweep["code"] = max(worst_code(jobs), 2)
            print(
                f"reportgen: the sweep summary could not be written: {exc}; job folders are in {sweep_dir}; "
                f"write it again with python -m reportgen.sweep summarize {sweep_dir}"
            )
        except Exception as exc:  # noqa: BLE001 - the jobs' codes must survive a broken summary
            log.exception("sweep summary failed")
            jobs = load_jobs(sweep_dir) if sweep_dir.exists() else []
            _last_sweep["code"] = max(worst_code(jobs), ExitCode.BUG)
            print(
                f"reportgen: the sweep summary could not be written ({type(exc).__name__}: {exc}); "
                f"job folders are in {sweep_dir}"
            )


def sweep_exit_code() -> int | None:
    """Exit code of the multirun that just ended in this process (from its jobs' ``job.json``),
    or ``None`` when no sweep ended here."""
    return _last_sweep.get("code")


def main(argv: list[str] | None = None) -> int:
    """``python -m reportgen.sweep summarize SWEEP_DIR``: write (again) and sign a sweep's summary.

    Returns:
        The worst job's exit code; 2 when the folder holds no sweep, the key is unusable or a
        file cannot be written.
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m reportgen.sweep", description="Write a sweep's summary again (e.g. after an interrupted one)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    again = commands.add_parser("summarize", help="rewrite and sign the summary of a finished sweep folder")
    again.add_argument("sweep_dir", help="the sweep folder (hydra.sweep.dir, e.g. multirun/DATE/TIME)")
    again.add_argument("--key", help="signing key (default: as for a run)")
    again.add_argument("--no-sign", action="store_true", help="write an UNSIGNED summary")
    again.add_argument("--no-pdf", action="store_true", help="HTML, CSV and JSON only")
    args = parser.parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    if not sweep_dir.is_dir() or not job_dirs(sweep_dir):
        print(
            f"reportgen.sweep: cannot start: {sweep_dir} holds no sweep jobs (pass hydra.sweep.dir, "
            "e.g. multirun/DATE/TIME)",
            file=sys.stderr,
        )
        return 2
    try:
        frame, code = summarize(
            sweep_dir,
            sign=not args.no_sign,
            key_path=args.key,
            pdf=not args.no_pdf,
            command=f"python -m reportgen.sweep summarize {sweep_dir}",
            rewrite=True,
        )
    except (SigningError, OutputWriteError) as exc:
        print(f"reportgen.sweep: cannot write the summary: {exc}", file=sys.stderr)
        return 2
    except SweepMismatch as exc:
        print(f"reportgen.sweep: refused: {exc}", file=sys.stderr)
        return 2
    print(console_table(frame, code, sweep_dir / "summary.html"))
    return code


if __name__ == "__main__":
    sys.exit(main())
