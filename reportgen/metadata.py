"""Run metadata shown in the report: the claim, environment, seeds, command, config."""
from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from hydra.utils import get_method
from omegaconf import DictConfig, OmegaConf

from . import __version__
from .distance import tolerances
from .recompute import use_reentrant
from .rng import GENERATORS
from .setup import Setup


def report_time() -> str:
    """UTC time of the run, ISO 8601; ``SOURCE_DATE_EPOCH`` (reproducible builds) wins."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = dt.datetime.fromtimestamp(int(epoch), dt.timezone.utc) if epoch else dt.datetime.now(dt.timezone.utc)
    return when.replace(microsecond=0).isoformat()


def user_code_commit(target: str) -> str:
    """Git commit (and ``+dirty``) of the repository holding the model factory's source file,
    or ``"not in a git repository"``."""
    try:
        source = Path(sys.modules[get_method(target).__module__].__file__).resolve().parent
        head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode:
            return "not in a git repository"
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain"], capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, AttributeError, KeyError, ImportError, subprocess.SubprocessError):
        return "unknown"


def rerun_command() -> str:
    """The exact command line to rerun this job (``python -m reportgen`` + the given arguments)."""
    return shlex.join(["python", "-m", "reportgen", *sys.argv[1:]])


def recompute_settings(cfg: DictConfig) -> dict[str, Any]:
    """The recompute settings the report and the diagnosis read: ``mode``, ``preserve_rng_state``."""
    rc = cfg.recompute
    return {"mode": getattr(rc.mode, "value", str(rc.mode)), "preserve_rng_state": bool(rc.preserve_rng_state)}


def run_metadata(cfg: DictConfig, setup: Setup, out_dir: Path) -> dict[str, Any]:
    """Everything the report shows besides the frame.

    Returns:
        dict with ``claim`` (model, mode, targets, wrapped, precision, device, rng settings),
        ``tolerances`` (rtol/atol used and where they come from), ``environment``, ``command``,
        ``config_yaml``, ``out_dir`` and ``created`` (ISO time).
    """
    rc = cfg.recompute
    configured = setup.tolerance()
    rtol, atol = tolerances(setup.autocast_dtype or setup.dtype, *configured)
    source = "configured" if cfg.parity.rtol is not None or cfg.parity.atol is not None else \
        f"torch.testing.assert_close defaults for {cfg.dtype}" if setup.autocast_dtype is None else \
        f"torch.testing.assert_close defaults for the autocast dtype {cfg.precision.autocast}"
    return {
        "title": cfg.report.title,
        "created": report_time(),
        "claim": {
            "model": str(cfg.model._target_),
            "task": str(cfg.task._target_),
            "mode": getattr(rc.mode, "value", str(rc.mode)),
            "targets": list(rc.targets),
            "wrapped": [{"path": w.path, "cls": w.cls} for w in setup.wrapped],
            "preserve_rng_state": bool(rc.preserve_rng_state),
            "determinism_check": str(rc.determinism_check),
            "save_ops": list(rc.save_ops),
            "precision": cfg.dtype + (f", autocast {cfg.precision.autocast}" if cfg.precision.autocast else ""),
            "compiled": (f"torch.compile (backend {cfg.compile.backend}) on both twins: the baseline is the compiled "
                         "plain twin" if cfg.compile.enabled else None),
            "device": str(setup.device),
            "method": getattr(rc.method, "value", str(rc.method)),
            "enable": rc.get("enable"),
            "use_reentrant": use_reentrant(rc),
            "observed": list(setup.observed) if setup.observed is not None else None,
            "ignored_attributes": list(cfg.state.ignore_attributes),
            "generators": list(GENERATORS) if cfg.forward_seed is not None else [],
        },
        "tolerances": {"rtol": rtol, "atol": atol, "source": source},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "reportgen": __version__,
            "platform": platform.platform(),
            "device": torch.cuda.get_device_name(setup.device) if setup.device.type == "cuda" else platform.processor() or "cpu",
            "seed": cfg.seed,
            "forward_seed": cfg.forward_seed,
            "user_code_commit": user_code_commit(cfg.model._target_),
        },
        "command": rerun_command(),
        "config_yaml": OmegaConf.to_yaml(cfg, resolve=True),
        "out_dir": str(out_dir),
    }
