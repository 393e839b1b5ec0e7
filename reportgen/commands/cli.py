"""``python -m reportgen +model=x``: the Hydra app (:func:`main`), its exit codes (:class:`reportgen.errors.ExitCode`,
docs/exit-codes.md) and what the console shows; the pipeline itself is :mod:`reportgen.commands.run`.

Hydra reports a compose error (unknown ``+model=nope``, a typo in a schema field) by printing it and calling
``sys.exit(1)`` before any job starts; that is a usage error here, so it becomes exit 2 with a line naming the fix.
In a multirun, the worst job code wins; an interrupted sweep stops at the interrupted job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from reportgen.commands.overrides import argv_problems
from reportgen.commands.rundir import StartRefused, job_log_path
from reportgen.config import register_configs
from reportgen.errors import ExitCode, Terminated, console_text, exception_label, usage
from reportgen.files import OutputWriteError
from reportgen.library_warnings import warnings_to_log
from reportgen.paths import builtin_models, conf_dir
from reportgen.trust.manifest import PENDING_NAME, SIGN_COMMAND

log = logging.getLogger("reportgen")
#: Every job's exit code (a multirun runs several jobs in one process).
_codes: list[int] = []
_terminated = False


def _on_sigterm(signum, frame) -> None:
    global _terminated
    _terminated = True
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread.

    The previous handler is restored on exit; ``_terminated`` records that SIGTERM arrived.
    """
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class OneLineExceptions(logging.Formatter):
    """Console formatter: a record with a traceback becomes one line naming the log file, and no
    console line shows a torch-internal exception class name (:func:`reportgen.errors.console_text`).

    The run's log file (Hydra's file handler) keeps the full traceback; the record itself is
    not changed, so handlers after this one still see ``exc_info``.
    """

    def __init__(self, inner: logging.Formatter | None, log_path: Path | None):
        super().__init__()
        self.inner = inner or logging.Formatter()
        self.log_path = log_path

    def format(self, record: logging.LogRecord) -> str:
        """See :class:`logging.Formatter`; ``message: Type: first line (traceback in LOG)``."""
        if not record.exc_info:
            return self.inner.format(
                logging.makeLogRecord({**record.__dict__, "msg": console_text(record.getMessage()), "args": ()})
            )
        exc = record.exc_info[1] or Exception("(no exception)")
        first = (str(exc).strip().splitlines() or [""])[0]
        where = f"full traceback in {self.log_path}" if self.log_path else "full traceback in the run's log"
        message = console_text(f"{record.getMessage()}: {exception_label(exc)}: {first}")
        cleared = {"exc_info": None, "exc_text": None, "stack_info": None, "args": ()}
        return self.inner.format(logging.makeLogRecord({**record.__dict__, **cleared, "msg": f"{message} ({where})"}))


def one_line_console(log_path: Path | None) -> None:
    """Give every console handler of the root logger a :class:`OneLineExceptions` formatter."""
    for handler in logging.getLogger().handlers:
        console = isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
        if console and not isinstance(handler.formatter, OneLineExceptions):
            handler.setFormatter(OneLineExceptions(handler.formatter, log_path))


def run_job(cfg: DictConfig, out_dir: str, multirun: bool = False) -> int:
    """One Hydra job (:func:`_run_job`), its outcome (exit code, verdict, overrides, error) recorded
    in ``out_dir/job.json`` for a sweep's summary (``reportgen.sweep``), whichever launcher ran it."""
    from reportgen.distributed.launch import adopt_slurm_env, launch_rank, launched  # torch: only once a job runs
    from reportgen.sweep.record import recorded_job

    if int(OmegaConf.select(cfg, "distributed.world_size", default=1) or 1) > 1:
        adopt_slurm_env()  # srun / submitit tasks of one sharded job: RANK, WORLD_SIZE, ... for torch
    if launched() and launch_rank() != 0:  # rank 0 records the job; the other ranks only take part
        return _run_job(cfg, out_dir, multirun)
    return recorded_job(out_dir, lambda: _run_job(cfg, out_dir, multirun))


def _run_job(cfg: DictConfig, out_dir: str, multirun: bool = False) -> int:
    """One Hydra job: check the model and the settings of the composed ``cfg``, then run the pipeline into
    ``out_dir`` (Hydra's ``runtime.output_dir``); returns the job's exit code (module docstring). In a sweep
    (``multirun``) an interrupt stops the whole sweep.

    Raises:
        SystemExit: an interrupted sweep job (after recording its code), to stop the sweep.
    """
    from reportgen.commands.validation import config_problems

    for noisy in ("fontTools", "weasyprint", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if cfg.get("model") is None or cfg.get("task") is None:
        print(usage())
        return ExitCode.USAGE
    problems = config_problems(cfg)
    if problems:
        print(f"reportgen: cannot start: {problems}")
        return ExitCode.USAGE
    log_path = job_log_path(Path(out_dir))
    one_line_console(log_path)
    with warnings_to_log(h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)):
        code = _guarded_run(cfg, Path(out_dir), log_path)  # a library's warning goes to the log, not the console
    if multirun and code in (ExitCode.SIGINT, ExitCode.SIGTERM):
        _codes.append(code)
        raise SystemExit(code)
    return code


def _guarded_run(cfg: DictConfig, out_dir: Path, log_path: Path | None) -> int:
    """``run.run`` with SIGTERM handled as Ctrl-C and any escaping exception as reportgen's bug (70)."""
    from reportgen.commands.run import run

    global _terminated
    _terminated = False
    with sigterm_as_interrupt():
        try:
            code = run(cfg, out_dir)
        except KeyboardInterrupt as exc:
            _terminated = _terminated or isinstance(exc, Terminated)  # also SIGTERM seen by torch's elastic agent
            partial, pending = out_dir / "results.partial.json", out_dir / PENDING_NAME
            kept = f"; what was measured is in {partial}" if partial.exists() else " before any check finished"
            if pending.exists():
                kept = (
                    f": all checks finished; the report was not signed. Results are in {out_dir / 'results.json'}; "
                    f"render and sign it with {SIGN_COMMAND} {out_dir}"
                )
            print(f"reportgen: interrupted ({'SIGTERM' if _terminated else 'Ctrl-C'}){kept}", flush=True)
            code = ExitCode.SIGINT
        except OutputWriteError as exc:  # disk full, read-only folder: the user's to fix, not a bug
            print(f"reportgen: cannot finish: {exc}.{_measured_in(out_dir)}", flush=True)
            return ExitCode.USAGE
        except Exception as exc:  # noqa: BLE001 - anything escaping the pipeline is reportgen's own bug
            trace = (type(exc), exc, exc.__traceback__)  # the full traceback into the run's log file, never the console
            record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "reportgen failed", (), trace)
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.FileHandler) and handler.baseFilename != os.devnull:
                    handler.handle(record)
            first = (str(exc).strip().splitlines() or [""])[0]
            print(
                f"reportgen: internal error, a bug in reportgen, not in your config: {exception_label(exc)}: "
                f"{console_text(first)}. Full traceback: {log_path or 'the run log'}.{_measured_in(out_dir)} "
                "Please report it with that log.",
                flush=True,
            )
            return ExitCode.BUG
    return ExitCode.SIGTERM if code == ExitCode.SIGINT and _terminated else code


def _measured_in(out_dir: Path) -> str:
    """`` What was measured is in FILES.`` naming the result files already written ("" when none), and how to
    render and sign them when every check finished (the run's mark, ``report.pending.json``, is there)."""
    files = [
        str(out_dir / n) for n in ("results.csv", "results.json", "results.partial.json") if (out_dir / n).exists()
    ]
    said = f" What was measured is in {', '.join(files)}." if files else ""
    if (out_dir / PENDING_NAME).exists():
        said += f" All checks finished: render and sign them with {SIGN_COMMAND} {out_dir}"
    return said


def exit_code(app: Callable[[], None], argv: list[str] | None = None) -> int:
    """Run the Hydra app and turn what happened into the process exit code (module docstring). What
    :func:`reportgen.commands.overrides.argv_problems` finds on the command line is refused first, in one line,
    exit 2, nothing written. ``app`` is the ``@hydra.main`` function; ``argv`` the command line after the program
    name (default ``sys.argv[1:]``).
    """
    problems = argv_problems(sys.argv[1:] if argv is None else argv)
    if problems:
        print(f"reportgen: cannot start: {problems}", flush=True)
        return ExitCode.USAGE
    try:
        with sigterm_as_interrupt():  # SIGTERM before the job starts: one line, and the folder lock is released
            app()
    except StartRefused:  # printed its one paragraph already
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print(f"reportgen: interrupted ({'SIGTERM' if _terminated else 'Ctrl-C'}) before any check ran", flush=True)
        return max(_codes + [ExitCode.SIGTERM if _terminated else ExitCode.SIGINT])
    except SystemExit as exc:
        if _codes:
            return max(_codes)
        if exc.code not in (0, None):
            models = ", ".join(builtin_models())
            print(
                f"reportgen: cannot start: fix the config error above (settings and their types: "
                f"reportgen/config.py; `--cfg job` prints the composed config). Built-in models: {models}."
            )
            return ExitCode.USAGE
        raise
    from reportgen.sweep.callback import sweep_exit_code

    swept = sweep_exit_code()  # a multirun: the worst code in the jobs' job.json files
    return swept if swept is not None else (max(_codes) if _codes else ExitCode.HOLDS)


@hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")
def _app(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    _codes.append(run_job(cfg, hydra_cfg.runtime.output_dir, multirun=hydra_cfg.mode == RunMode.MULTIRUN))


def main() -> None:
    """Console entry point of ``python -m reportgen`` and the ``reportgen`` script: registers the config
    schemas, runs the Hydra app and exits with this module's codes (0, 1, 2, 3, 70, 130, 143)."""
    register_configs()
    sys.exit(exit_code(_app))
