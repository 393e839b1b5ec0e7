"""The end of a multirun: the Hydra callback that summarises the sweep and keeps the worst job's exit code,
and ``python -m reportgen.sweep summarize SWEEP_DIR`` (console script ``reportgen-sweep``) that writes it again."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from reportgen.errors import ExitCode
from reportgen.files import OutputWriteError
from reportgen.report.metadata import rerun_command
from reportgen.sweep.jobs import job_dirs, load_jobs
from reportgen.sweep.summary import SweepMismatch, summarize
from reportgen.sweep.table import console_table, worst_code
from reportgen.trust.keys import SigningError

log = logging.getLogger("reportgen")

_last_sweep: dict[str, Any] = {}


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
        except Exception as exc:  # the jobs' codes must survive a broken summary
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
    except (SigningError, OutputWriteError, SweepMismatch) as exc:
        said = "refused" if isinstance(exc, SweepMismatch) else "cannot write the summary"
        print(f"reportgen.sweep: {said}: {exc}", file=sys.stderr)
        return 2
    print(console_table(frame, code, sweep_dir / "summary.html"))
    return code
