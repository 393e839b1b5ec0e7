"""The pipeline, top to bottom: config → setup (twins) → checks → frame → files → report.

Mirrors the data flow in docs/architecture.md. Each stage is one call; each registered check
(reportgen/checks/__init__.py) runs in its own ``try`` so an exception becomes an ERROR row
and the report still renders.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from reportgen.checks import REGISTRY, Check, required_names, run_order
from reportgen.checks.base.run import Run
from reportgen.checks.distributed.check import follow
from reportgen.checks.memory.check import run_peak_rows
from reportgen.ci import finish_ci_outputs, write_ci_outputs
from reportgen.ci.summary import SAID
from reportgen.ci.verdict import exit_code
from reportgen.claim import claim_required, parse_claim
from reportgen.claim.stage import console_lines, judge_claim
from reportgen.commands.planned import planned_peak
from reportgen.commands.rundir import forget_unstarted_run, unwritable
from reportgen.config import MEMORY
from reportgen.distributed.launch import (
    device_problem,
    launch_problem,
    launch_rank,
    launched,
    rank_config,
)
from reportgen.errors import ExitCode, Terminated, UsageError, clip_keeping_advice, console_text
from reportgen.files import atomic_write, replace_write
from reportgen.limits import CheckLimitExceeded, check_limits, limited
from reportgen.memory.device_peak import phase_peak
from reportgen.memory.step_peak import format_bytes
from reportgen.report.diagnose import diagnose
from reportgen.report.metadata import recompute_settings, run_metadata
from reportgen.report.pdf import renderer_problem
from reportgen.report.render import render_report
from reportgen.report.tried import look_and_try
from reportgen.results import (
    Role,
    Row,
    Status,
    claim_verdict,
    frame_from_json,
    frame_to_json,
    results_csv,
    to_frame,
)
from reportgen.results.frame import detectors
from reportgen.results.raised import error_row
from reportgen.threads import apply_threads
from reportgen.training.duration import refuse_long_runs
from reportgen.trust.keys import load_signing_key, signature_label
from reportgen.trust.launch import job_launch
from reportgen.trust.manifest import clear_pending, mark_pending, start_manifest
from reportgen.trust.signing import sign_run
from reportgen.twins.observe import observation_rows
from reportgen.twins.prepare import prepare as prepare_twins
from reportgen.twins.setup import Setup

log = logging.getLogger("reportgen")


class Interrupted(Exception):
    """Ctrl-C (or SIGTERM) during the checks, after the partial frame (with NOT_RUN rows) was written.

    Attributes:
        terminated: True for SIGTERM (exit 143), False for Ctrl-C / SIGINT (exit 130).
    """

    def __init__(self, terminated: bool = False):
        super().__init__("SIGTERM" if terminated else "SIGINT")
        self.terminated = terminated


def run(cfg: DictConfig, out_dir: Path) -> int:
    """Run the checklist on ``cfg.model`` and write results and the report into ``out_dir``.

    Returns:
        0 when the claim holds, 1 when it fails, 2 when the run could not start (including
        settings estimated past ``run.max_estimated_minutes``, :mod:`reportgen.training.duration`), 3 when the
        claim cannot be judged (INCONCLUSIVE), 130 when it was interrupted during the checks
        (``results.partial.json`` keeps what was measured).
    """
    start_manifest(out_dir)  # the statement signs only what this run writes (reportgen.trust.manifest)
    threads = apply_threads(cfg.threads)  # the one place: every twin, rank and job of this process
    log.info("torch threads: %s", threads.describe())
    world = int(cfg.distributed.world_size)
    if problem := launch_problem(world):
        print(f"reportgen: cannot start: {problem}")
        forget_unstarted_run(out_dir)
        return ExitCode.USAGE
    if world > 1 and launched():
        cfg = rank_config(cfg)  # this rank's own GPU
        if launch_rank() != 0:
            return run_rank(cfg, out_dir)
    try:
        claim = parse_claim(cfg.claim)  # the release note's clauses (exit 2 on one it cannot read)
        key = load_signing_key(cfg.report.sign, cfg.report.key_path)  # no key, no model work
        if problem := unwritable(out_dir) or (cfg.report.pdf and renderer_problem()):  # nor without a report
            raise UsageError(problem)
        setup = prepare(cfg)
        with limited("estimating the run's duration", *check_limits(cfg)):
            refuse_long_runs(setup)  # settings that imply hours: exit 2 with the estimate and the override
    except CheckLimitExceeded as exc:  # a twin that never returns while timed: the checks say so, each as a row
        log.error("%s", exc.message)
    except UsageError as exc:
        print(f"reportgen: cannot start: {console_text(str(exc))}")
        forget_unstarted_run(out_dir)  # nothing measured: the corrected command may reuse the folder
        return ExitCode.USAGE
    required = required_names(cfg.verdict.required, distributed=world > 1) + claim_required(cfg.claim)
    meta = run_metadata(cfg, setup, out_dir) | {"signature": signature_label(key), "threads": threads.describe()}
    if claim:
        meta["claim"]["release"] = claim.record()  # page 1 and the signed statement
    meta["environment"]["torch_threads"] = threads.describe()  # also in the signed statement's environment
    meta["sweep"] = job_launch()  # a sweep's job signs its launch, number and overrides (None for a single run)
    run = Run(setup, cfg)
    try:
        rows = run_checks(run, out_dir)
    except Interrupted as exc:  # nothing interrupted is signed as a verdict
        print(f"reportgen: interrupted; what was measured is in {out_dir / 'results.partial.json'}")
        return ExitCode.SIGTERM if exc.terminated else ExitCode.SIGINT  # the partial frame stays on disk
    if any(r.check == MEMORY and r.status != Status.NOT_RUN for r in rows):  # the whole run's peak, beside one twin's
        rows += run_peak_rows(setup, run.phase_peaks)
    rows += observation_rows(setup)  # a switch that recomputes nothing is a finding
    rows += diagnose(rows, look_and_try(run, rows, recompute_settings(setup)))  # fixes that are settings, tried
    rows += judge_claim(setup, claim, to_frame(rows))  # one judged row per clause of the release claim
    if planned := planned_peak(setup, rows):  # a plan's recompute file: the plan's figure at this shape (page 1)
        rows.append(planned[0])
        meta["plan"] = planned[1]
    frame = to_frame(rows)
    meta["detectors"] = detectors(frame)  # stated beside the verdict in every output ("" when the controls ran)
    verdict = claim_verdict(frame, required)
    write_results(frame, out_dir)
    private_key = key.private_key if key is not None else None
    mark_pending(out_dir, meta, required, pdf=cfg.report.pdf, sign=key is not None, private_key=private_key)
    render_report(frame, meta, verdict, out_dir, pdf=cfg.report.pdf, required=required)  # interrupted: reportgen.sign
    write_ci_outputs(frame, meta, verdict, required, out_dir)  # junit.xml, summary.md: signed with the rest
    sign_run(frame, meta, verdict, out_dir, key, required=required)
    clear_pending(out_dir)
    finish_ci_outputs(frame, verdict, out_dir)  # verdict.json (names the statement's digest), $GITHUB_STEP_SUMMARY
    log.info("verdict %s; report in %s", verdict, out_dir)
    for check, item, detail in (
        frame.loc[frame.status == Status.WARN, ["check", "item", "detail"]].drop_duplicates("check").values[:4]
    ):
        detail = console_text(f"{item}: {detail}")
        print(f"reportgen: WARN {check}: {clip_keeping_advice(detail)}")
    if verdict != Status.PASS:
        for line in why_lines(frame):
            print(line)
    print("\n".join(console_lines(frame, out_dir / "report.html")))
    if meta["detectors"]:  # stated wherever the verdict is: the console too
        why = meta["detectors"].removeprefix("detectors not proven: ")
        print(f"reportgen: DETECTORS NOT PROVEN: {clip_keeping_advice(console_text(why))}")
    said = SAID.get(verdict, "FAILS")
    print(f"reportgen: claim {said} ({verdict}); report: {out_dir / 'report.html'}")  # the verdict is the last line
    return exit_code(verdict)


def why_lines(frame, most: int = 3) -> list[str]:
    """Console lines for a claim that does not hold: one per diagnosis (``reportgen.report.diagnose``) with the
    checks it explains and its fix, at most ``most``; the cause and the evidence are in the report."""
    said: dict[str, tuple[list[str], str]] = {}
    if "fix" not in frame.columns:  # no diagnosis row (e.g. only NOT_RUN checks)
        return []
    for check, fix in frame.loc[frame.role == Role.DIAGNOSIS, ["check", "fix"]].values:
        said.setdefault(fix, ([], fix))[0].append(check)  # one line per fix, as page 1 groups them
    return [f"reportgen: fix ({', '.join(checks)}): {fix}" for checks, fix in list(said.values())[:most]]


def prepare(cfg: DictConfig) -> Setup:
    """The stages before any check (:func:`reportgen.twins.prepare.prepare`), refusing sharded ranks on
    CUDA that would not have a GPU each.

    Raises:
        SetupError: the model or task cannot be built, the task breaks its contract
            (``reportgen.twins.contract.TaskContractError``), or sharded ranks on CUDA have no GPU each;
            the run exits 2.
        RecomputeConfigError: the recompute settings cannot be applied to this model.
    """
    world = int(cfg.distributed.world_size)
    return prepare_twins(cfg, device_problem=functools.partial(device_problem, world))


def run_rank(cfg: DictConfig, out_dir: Path) -> int:
    """A rank other than 0 of a torchrun/srun launch: build the twins, take part in the sharded
    checks, hand the rows to rank 0 (which writes the one report) and write nothing.

    Returns:
        0 when this rank took part, 2 when its setup could not start (the message says why).
    """
    try:
        setup = prepare(cfg)
    except UsageError as exc:
        print(f"reportgen: rank {launch_rank()} cannot start: {console_text(str(exc))}")
        return ExitCode.USAGE
    follow(setup)  # writes nothing: out_dir may be rank 0's own folder (srun tasks share one)
    log.info("rank %d: rows handed to rank 0", launch_rank())
    return ExitCode.HOLDS


def run_checks(run: Run, out_dir: Path) -> list[Row]:
    """Run every registered check on ``run`` (each gets the same :class:`Run`: the setup and what the checks share);
    after each, rewrite ``results.partial.json`` so a run that stops early still leaves the frame of what it
    measured."""
    rows: list[Row] = []
    setup = run.setup
    registry = run_order(REGISTRY, distributed=setup.config.distributed.world_size > 1, joined=launched())
    if setup.compile_error is not None:  # nothing can be measured on twins compile cannot run
        detail = (
            f"not run: compile.enabled=true but torch.compile could not run the twins ({setup.compile_error}); "
            "run with compile.enabled=false"
        )
        return [Row.not_run(s.name, detail, item="compile") for check in registry for s in check.sections]
    limits = check_limits(setup.config)
    for index, check in enumerate(registry):
        if check.config and not getattr(setup.config, check.config).enabled:
            rows += disabled_rows(check)
            continue
        log.info("check: %s", check.name)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings(), limited(check.name, *limits), measured(run, check.name):
                warnings.simplefilter("ignore", UserWarning)  # the console stays readable; gradient parity
                rows += check.run(run)  # records torch's warnings as rows itself
        except CheckLimitExceeded as exc:  # a hazard (a region that never returns): a row, and the run goes on
            log.error("check %s stopped: %s", check.name, exc.message)
            item, seconds = f"stopped at checks.{exc.limit}", time.perf_counter() - start
            error: dict[str, Any] = {"status": Status.ERROR, "metric": "exception", "seconds": seconds}
            error["extra"] = {"exception_type": "CheckLimitExceeded"}
            rows.append(Row.fact(check.name, item, Role.EXCEPTION, exc.message, **error))
        except KeyboardInterrupt as exc:
            interrupted = "the run was interrupted (Ctrl-C or SIGTERM) before this check finished"
            rows += [
                Row.not_run(s.name, interrupted, item="interrupted")
                for later in registry[index:]
                for s in later.sections
            ]
            replace_write(out_dir / "results.partial.json", frame_to_json(to_frame(rows)))
            raise Interrupted(isinstance(exc, Terminated)) from None
        except Exception as exc:  # a crash inside a check is an ERROR row
            log.exception("check %s raised", check.name)
            rows.append(error_row(check.name, exc, "check", time.perf_counter() - start))
        replace_write(out_dir / "results.partial.json", frame_to_json(to_frame(rows)))
    return rows


@contextlib.contextmanager
def measured(run: Run, phase: str) -> Iterator[None]:
    """Record the peak memory of one check in ``run.phase_peaks`` (also when it raises) and log it."""
    with phase_peak(phase, run.setup.device) as peak:
        try:
            yield
        finally:
            run.phase_peaks.append(peak)
    log.info("check %s: peak %s (%s)", phase, format_bytes(peak.bytes), peak.metric)


def disabled_rows(check: Check) -> list[Row]:
    """One row per section of a check turned off by ``<group>.enabled=false``: NOT_RUN (a required
    check without rows fails the claim), FLAGGED for a flagged experiment (never counts)."""
    detail = f"not run: {check.config}.enabled=false"
    return [
        Row.fact(s.name, str(check.config), Role.DISABLED, detail, status=Status.FLAGGED, metric="not_run")
        if s.flagged
        else Row.not_run(s.name, detail, item=str(check.config))
        for s in check.sections
    ]


def write_results(frame, out_dir: Path) -> None:
    """results.json (the single source of truth) and results.csv, the CSV of exactly its rows (``reportgen.sign``
    and ``reportgen.verify`` re-derive it byte for byte; a column with no value in any row is in neither), then
    drop the partial file."""
    text = frame_to_json(frame)
    atomic_write(out_dir / "results.csv", results_csv(frame_from_json(text)))
    atomic_write(out_dir / "results.json", text)
    (out_dir / "results.partial.json").unlink(missing_ok=True)
