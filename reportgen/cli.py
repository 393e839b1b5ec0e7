"""Exit codes around Hydra: 0 claim holds, 1 claim fails, 2 the run could not start.

Hydra reports a compose error (unknown ``+model=nope``, a typo in a schema field) by
printing it and calling ``sys.exit(1)`` before any job starts; that is a usage error here,
so it becomes exit 2 with a line naming the fix. In a multirun, the worst job code wins.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig

from .paths import builtin_models

_codes: list[int] = []


def usage() -> str:
    """The short message printed when no usable model was given."""
    models = builtin_models()
    return (f"reportgen: choose a model. Built-in models: {', '.join(models)}.\n"
            f"  python -m reportgen +model={models[0]}\n"
            "Your own model: python -m reportgen --config-dir DIR +model=NAME (see README, 'Your own model').")


def run_job(cfg: DictConfig, out_dir: str) -> int:
    """One Hydra job: check that a model was chosen, then run the pipeline.

    The job's outcome (exit code, verdict, overrides, error) goes into ``out_dir/job.json``,
    which a sweep's summary reads (``reportgen.sweep``), whichever launcher ran the job.
    """
    from .sweep import recorded_job

    return recorded_job(out_dir, lambda: _run_job(cfg, out_dir))


def _run_job(cfg: DictConfig, out_dir: str) -> int:
    for noisy in ("fontTools", "weasyprint", "matplotlib", "PIL"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if cfg.get("model") is None or cfg.get("task") is None:
        print(usage())
        return 2
    from .run import run

    return run(cfg, Path(out_dir))


def record(code: int) -> None:
    """Remember a job's exit code (multirun runs several jobs in one process)."""
    _codes.append(code)


def exit_code(app: Callable[[], None]) -> int:
    """Run the Hydra app and turn what happened into the process exit code."""
    try:
        app()
    except SystemExit as exc:
        if not _codes and exc.code not in (0, None):
            models = ", ".join(builtin_models())
            print(f"reportgen: cannot start: fix the config error above (settings and their types: "
                  f"reportgen/config.py; `--cfg job` prints the composed config). Built-in models: {models}.")
            return 2
        raise
    from .sweep import sweep_exit_code

    swept = sweep_exit_code()  # a multirun: the worst code in the jobs' job.json files
    return swept if swept is not None else (max(_codes) if _codes else 0)
