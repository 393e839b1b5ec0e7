"""The pipeline, top to bottom: config → setup (twins) → checks → frame → files → report.

Mirrors the data flow in DESIGN.md. Each stage is one call; each check runs in its own
``try`` so an exception becomes an ERROR row and the report still renders.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from .checks.budget import task_metrics
from .checks.common import error_row
from .checks.larger_batch import larger_batch_experiment
from .checks.memory import warm_step_memory
from .checks.parity import gradient_parity
from .checks.policy import SELECTIVE_POLICY, selective_policy
from .checks.step import step_and_state_parity
from .checks.timing import warm_step_time
from .config import GRADIENT_PARITY, LARGER_BATCH, MEMORY, STEP_PARITY, TASK_METRICS, TIME
from .metadata import run_metadata
from .recompute import RecomputeConfigError
from .render import render_report
from .results import NOT_RUN, PASS, Row, atomic_write, claim_verdict, frame_to_json, replace_write, to_frame
from .setup import Setup, SetupError, build_setup
from .signing import SigningError, load_signing_key, sign_run, signature_label

log = logging.getLogger("reportgen")

#: ``(name shown while running, check function)`` in checklist order (DESIGN.md).
CHECKS: list[tuple[str, Callable[[Setup], list[Row]]]] = [
    (GRADIENT_PARITY, gradient_parity),
    (STEP_PARITY + " / state parity", step_and_state_parity),
    (SELECTIVE_POLICY, selective_policy),
    (MEMORY, warm_step_memory),
    (TIME, warm_step_time),
    (TASK_METRICS, task_metrics),
    (LARGER_BATCH, larger_batch_experiment),
]

EXIT_HOLDS, EXIT_FAILS, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  #: the shell's code for SIGINT; the partial frame stays on disk


class Interrupted(Exception):
    """Ctrl-C during the checks, after the partial frame (with NOT_RUN rows) was written."""


def run(cfg: DictConfig, out_dir: Path) -> int:
    """Run the checklist on ``cfg.model`` and write results and the report into ``out_dir``.

    Returns:
        0 when the claim holds, 1 when it fails, 2 when the run could not start, 130 when
        it was interrupted during the checks (``results.partial.json`` keeps what was measured).
    """
    try:
        key = load_signing_key(cfg.report.sign, cfg.report.key_path)  # no key, no model work
        setup = build_setup(cfg)
    except (SigningError, SetupError, RecomputeConfigError) as exc:
        print(f"reportgen: cannot start: {exc}")
        return EXIT_USAGE
    meta = run_metadata(cfg, setup, out_dir) | {"signature": signature_label(key)}
    try:
        rows = run_checks(setup, out_dir)
    except Interrupted:
        print(f"reportgen: interrupted; what was measured is in {out_dir / 'results.partial.json'}")
        return EXIT_INTERRUPTED
    frame = to_frame(rows)
    verdict = claim_verdict(frame, cfg.verdict.required)
    write_results(frame, out_dir)
    render_report(frame, meta, verdict, out_dir, pdf=cfg.report.pdf, required=list(cfg.verdict.required))
    sign_run(frame, meta, verdict, out_dir, key, required=list(cfg.verdict.required))
    log.info("verdict %s; report in %s", verdict, out_dir)
    print(f"reportgen: claim {'HOLDS' if verdict == PASS else 'FAILS'} ({verdict}); report: {out_dir / 'report.html'}")
    return EXIT_HOLDS if verdict == PASS else EXIT_FAILS


def run_checks(setup: Setup, out_dir: Path) -> list[Row]:
    """Run every check; after each, rewrite ``results.partial.json`` so a run that stops early
    still leaves the frame of what it measured."""
    rows: list[Row] = []
    for index, (name, check) in enumerate(CHECKS):
        log.info("check: %s", name)
        start = time.perf_counter()
        try:
            rows += check(setup)
        except KeyboardInterrupt:
            rows += [Row(n.split(" / ")[0], "interrupted", "recompute", "not_run", status=NOT_RUN,
                         detail="the run was interrupted (Ctrl-C) before this check finished")
                     for n, _ in CHECKS[index:]]
            replace_write(out_dir / "results.partial.json", frame_to_json(to_frame(rows)))
            raise Interrupted from None
        except Exception as exc:  # noqa: BLE001 - a crash inside a check is an ERROR row
            log.exception("check %s raised", name)
            rows.append(error_row(name.split(" / ")[0], exc, "check", time.perf_counter() - start))
        replace_write(out_dir / "results.partial.json", frame_to_json(to_frame(rows)))
    return rows


def write_results(frame, out_dir: Path) -> None:
    """results.csv and results.json (the single source of truth), then drop the partial file."""
    atomic_write(out_dir / "results.csv", frame.to_csv(index=False))
    atomic_write(out_dir / "results.json", frame_to_json(frame))
    (out_dir / "results.partial.json").unlink(missing_ok=True)
