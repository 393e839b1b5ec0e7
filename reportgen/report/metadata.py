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

from reportgen import __version__
from reportgen.config import RecomputeMode
from reportgen.distributed.launch import launch_commands, launched, resolve_backend
from reportgen.distributed.mesh import layout_of
from reportgen.distributed.wrapping import settings_in_force, strategy_name, wrap_order
from reportgen.files import sha256_file
from reportgen.results.distance import tolerances
from reportgen.rng import GENERATORS
from reportgen.trust.sources import (
    PACKAGE_DIR,
    display_path,
    git_repositories,
    pythonpath_entries,
    reportgen_sources_sha256,
    user_source_digests,
)
from reportgen.twins.setup import Setup

#: Hydra's options that name the primary config; they travel into the rerun command.
CONFIG_OPTIONS = {
    "--config-dir": "--config-dir",
    "-cd": "--config-dir",
    "--config-path": "--config-path",
    "-cp": "--config-path",
    "--config-name": "--config-name",
    "-cn": "--config-name",
}
#: Options naming a folder relative to the working folder, shown relative to it where possible
#: (``--config-path`` is relative to reportgen's entry module, so it is kept as given).
FOLDER_OPTIONS = ("--config-dir",)

#: Model-config keys that may name a local file or folder the model is built from (Hugging Face's
#: ``model.config`` / ``model.pretrained``); page 1 names each with its digest.
MODEL_FILE_KEYS = ("config", "pretrained")


def model_files(model_cfg: Any, cwd: Path | None = None) -> list[dict[str, str]]:
    """The local files the model is built from: ``[{"key", "path" (relative to ``cwd`` where inside it),
    "sha256" (of the file, or of config.json in a folder)}]`` for each of :data:`MODEL_FILE_KEYS` that
    names an existing file or folder."""
    out = []
    for key in MODEL_FILE_KEYS:
        value = model_cfg.get(key) if hasattr(model_cfg, "get") else None
        path = Path(str(value)) if isinstance(value, str) and value else None
        if path is None or not path.exists() or (path.is_dir() and not (path / "config.json").is_file()):
            continue
        digest = sha256_file(path / "config.json" if path.is_dir() else path)
        out.append({"key": f"model.{key}", "path": display_path(path, cwd), "sha256": digest})
    return out


def relative_override(override: str, cwd: Path) -> str:
    """``key=/abs/path`` → ``key=rel/path`` when the value is an existing path inside ``cwd`` (a rerun
    command that works from the run's folder on any machine); anything else unchanged."""
    key, eq, value = override.partition("=")
    if not eq or not value.startswith("/") or not Path(value).exists():
        return override
    return f"{key}={display_path(value, cwd)}"


def report_time() -> str:
    """UTC time of the run, ISO 8601; ``SOURCE_DATE_EPOCH`` (reproducible builds) wins."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = dt.datetime.fromtimestamp(int(epoch), dt.UTC) if epoch else dt.datetime.now(dt.UTC)
    return when.replace(microsecond=0).isoformat()


def user_code_commit(target: str) -> str:
    """Git commit (and ``+dirty``) of the repository holding the model factory's source file,
    or ``"not in a git repository"``."""
    try:
        source = Path(sys.modules[get_method(target).__module__].__file__ or "").resolve().parent
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if head.returncode:
            return "not in a git repository"
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain"], capture_output=True, text=True, timeout=10
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, AttributeError, KeyError, ImportError, subprocess.SubprocessError):
        return "unknown"


def _split_argv(args: list[str]) -> tuple[list[tuple[str, str]], list[str], bool]:
    """``(config options as (long name, value), other arguments, multirun flag)`` of Hydra's argv."""
    options, rest, multirun, index = [], [], False, 0
    while index < len(args):
        arg = args[index]
        name, eq, value = arg.partition("=")
        if name in CONFIG_OPTIONS and eq:
            options.append((CONFIG_OPTIONS[name], value))
        elif arg in CONFIG_OPTIONS and index + 1 < len(args):
            options.append((CONFIG_OPTIONS[arg], args[index + 1]))
            index += 1
        elif arg in ("-m", "--multirun"):
            multirun = True
        else:
            rest.append(arg)
        index += 1
    return options, rest, multirun


#: Hydra settings that only say where a run's files go: a rerun leaves them out, since the folder they
#: name holds the run already (reportgen refuses it) and the default makes a new timestamped one.
OUTPUT_LOCATION = (
    "hydra.run.",
    "hydra.sweep.",
    "hydra.output_subdir",
    "hydra.job.name",
    "hydra.job.id",
    "hydra.job.num",
)


def names_output_folder(override: str) -> bool:
    """Whether an override (``hydra.run.dir=x``, ``++hydra.sweep.dir=y``) only sets an output location."""
    key = override.lstrip("+~").partition("=")[0]
    return any(key.startswith(p) if p.endswith(".") else key == p for p in OUTPUT_LOCATION)


def rerun_command(
    argv: list[str] | None = None,
    environ: dict | None = None,
    cwd: Path | None = None,
    job_overrides: list[str] | None = None,
) -> str:
    """The command line that reruns this job from the folder it ran in.

    ``PYTHONPATH=...`` when the process had one (each folder relative to ``cwd`` when inside
    it), then ``python -m reportgen``, the config options given (``--config-dir``,
    ``--config-path``, ``--config-name``; folders relative where possible) and the overrides.
    In a multirun job, ``job_overrides`` (Hydra's ``overrides.task`` of the job) replace the
    sweep's comma lists and ``-m``, so each job's report says how to rerun that job alone; a
    ``hydra.searchpath`` override is kept. Output-location overrides (``hydra.run.dir=...``,
    :data:`OUTPUT_LOCATION`) are left out: that folder holds this run, so the rerun gets a new one.

    Args:
        argv: the process's arguments (default ``sys.argv``).
        environ: the environment (default ``os.environ``).
        cwd: the working folder (default the current one).
        job_overrides: the job's own overrides in a multirun, else None.

    Returns:
        One shell-quoted line, e.g. ``PYTHONPATH=my_project python -m reportgen --config-dir my_project/conf +model=mine``.
    """
    argv = sys.argv if argv is None else argv
    cwd = Path.cwd() if cwd is None else Path(cwd)
    options, overrides, multirun = _split_argv(list(argv[1:]))
    if job_overrides is not None:
        overrides = [o for o in overrides if o.startswith("hydra.searchpath")] + list(job_overrides)
    elif multirun:
        overrides = ["-m", *overrides]
    overrides = [o for o in overrides if not names_output_folder(o)]
    parts = ["python", "-m", "reportgen"]
    for name, value in options:
        folder = display_path(cwd / value, cwd) if name in FOLDER_OPTIONS and not value.startswith("pkg://") else value
        parts += [name, folder]
    command = shlex.join(parts + [relative_override(o, cwd) for o in overrides])
    entries = pythonpath_entries(environ)
    if entries:
        command = f"PYTHONPATH={shlex.quote(os.pathsep.join(display_path(cwd / e, cwd) for e in entries))} {command}"
    return command


def _job_overrides() -> list[str] | None:
    """The overrides of this multirun job (Hydra's ``overrides.task``), or None outside a multirun."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            return list(HydraConfig.get().overrides.task)
    except (ImportError, ValueError):
        pass
    return None


def provenance(cwd: Path | None = None) -> dict[str, Any]:
    """What the run's code was: the user's source files and the git state around them.

    Read from ``sys.modules`` after the model and task were built (:mod:`reportgen.trust.sources`):
    every loaded module outside the standard library, site-packages and reportgen.

    Returns:
        ``{"user_sources": {path: hex SHA-256}, "user_repositories": [{"repository",
        "commit", "dirty", "files"}], "reportgen_sources_sha256", "reportgen_repository"}``;
        paths relative to ``cwd`` where inside it; ``dirty`` is None when git could not tell
        (not installed, not a repository).
    """
    digests = user_source_digests()
    repos = git_repositories(digests)
    own = git_repositories([PACKAGE_DIR / "__init__.py"])[0]
    for repo in [*repos, own]:
        if repo["repository"] is not None:
            repo["repository"] = display_path(repo["repository"], cwd)
    return {
        "user_sources": {display_path(p, cwd): d for p, d in digests.items()},
        "user_repositories": repos,
        "reportgen_sources_sha256": reportgen_sources_sha256(),
        "reportgen_repository": own,
    }


def recompute_settings(setup: Setup) -> dict[str, Any]:
    """The recompute settings the report and the diagnosis read: ``mode``, the mode in force (:attr:`Setup.mode`,
    which says what the model's own default was when ``recompute.mode`` is unset; None when nothing says),
    ``preserve_rng_state``, ``strategy`` (``distributed.strategy`` of a sharded run, else None), ``distributed``,
    its wrapping settings in force (:func:`reportgen.distributed.wrapping.settings_in_force`; empty when not sharded),
    ``mesh``, the named mesh degrees in force (``{"dp_shard": 2, "tp": 2}``; empty for the 1-D mesh or one process)
    and ``own_step``, whether the task's own ``forward_backward`` ran (its later forwards follow a recomputing
    backward, so a differing loss does not place the cause before recomputation)."""
    dc = setup.config.distributed
    strategy = dc.strategy.value if dc.world_size > 1 else None
    wrapping = settings_in_force(dc, [w.path for w in setup.wrapped]) if strategy else {}
    return {
        "mode": None if setup.mode is None else setup.mode.value,
        "preserve_rng_state": setup.config.recompute.preserve_rng_state,
        "strategy": strategy,
        "distributed": wrapping,
        "mesh": dict(layout_of(dc).degrees) if strategy else {},
        "own_step": not setup.training_step.sees_outputs,
    }


def distributed_claim(setup: Setup) -> dict:
    """Page 1's sharding facts: world size, strategy, backend, mesh, and the commands that reproduce it."""
    dc, world = setup.config.distributed, setup.config.distributed.world_size
    strategy = strategy_name(dc)
    commands = launch_commands(world)
    mesh = {"ddp": "replicated, gradients all-reduced", "custom": f"given to {dc.wrap}"}.get(strategy, "sharded")
    layout = layout_of(dc)
    named = f"{layout.said()}, {world} ranks; each batch split over its {layout.dp_size} data-parallel ranks"
    return {
        "world_size": world,
        "strategy": strategy,
        "backend": resolve_backend(str(dc.backend), setup.device),
        "mesh": f"{named} ({mesh})" if layout.names else f"1-D, {world} ranks ({mesh})",
        "timeout_s": float(dc.timeout_s),
        "launched_by": "torchrun/srun" if launched() else "torch elastic_launch",
        "launch": commands["reportgen"],
        "torchrun": commands["torchrun"],
        "settings": settings_in_force(dc, [w.path for w in setup.wrapped]),
        "order": wrap_order(dc),
    }


def run_metadata(cfg: DictConfig, setup: Setup, out_dir: Path) -> dict[str, Any]:
    """Everything the report shows besides the frame.

    Returns:
        dict with ``claim`` (model, mode, targets, wrapped, precision, device, rng settings, whose training
        step, the sharding facts of a run on several ranks: :func:`distributed_claim`),
        ``tolerances`` (rtol/atol used and where they come from), ``environment``, ``command``,
        ``config_yaml``, ``out_dir`` and ``created`` (ISO time). ``environment`` carries the
        :func:`provenance` of the code (user source digests, their repositories' dirty flags),
        which the signed statement repeats.
    """
    rc = setup.config.recompute
    configured = setup.tolerance()
    rtol, atol = tolerances(setup.autocast_dtype or setup.dtype, *configured)
    source = (
        "configured"
        if setup.config.parity.rtol is not None or setup.config.parity.atol is not None
        else f"torch.testing.assert_close defaults for {cfg.dtype}"
        if setup.autocast_dtype is None
        else f"torch.testing.assert_close defaults for the autocast dtype {cfg.precision.autocast}"
    )
    meta = {
        "title": cfg.report.title,
        "created": report_time(),
        "claim": {
            "model": str(cfg.model._target_),
            "architecture": setup.architecture,
            "model_files": model_files(cfg.model),
            "task": str(cfg.task._target_),
            "mode": "the model's own default" if setup.mode is None else setup.mode.value,
            "mode_note": setup.mode_note,
            "targets": list(rc.targets),
            "wrapped": [{"path": w.path, "cls": w.cls} for w in setup.wrapped],
            "preserve_rng_state": rc.preserve_rng_state,
            "determinism_check": rc.determinism_check,
            "save_ops": list(rc.save_ops),
            "precision": cfg.dtype + (f", autocast {cfg.precision.autocast}" if cfg.precision.autocast else ""),
            "compiled": (
                f"torch.compile (backend {cfg.compile.backend}) on both twins: the baseline is the compiled plain twin"
                if cfg.compile.enabled
                else None
            ),
            "device": str(setup.device),
            "method": rc.method.value,
            "enable": rc.enable,
            "use_reentrant": None if setup.mode is None else setup.mode is RecomputeMode.reentrant,
            "observed": list(setup.observed) if setup.observed is not None else None,
            "step": setup.training_step.said(),  # page 1: whose training step each check ran
            "ignored_attributes": list(cfg.state.ignore_attributes),
            "generators": list(GENERATORS) if cfg.forward_seed is not None else [],
        },
        "tolerances": {"rtol": rtol, "atol": atol, "source": source},
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "reportgen": __version__,
            "platform": platform.platform(),
            "device": torch.cuda.get_device_name(setup.device)
            if setup.device.type == "cuda"
            else platform.processor() or "cpu",
            "seed": cfg.seed,
            "forward_seed": cfg.forward_seed,
            "user_code_commit": user_code_commit(cfg.model._target_),
            **provenance(),
        },
        "command": rerun_command(job_overrides=_job_overrides()),
        "config_yaml": OmegaConf.to_yaml(cfg, resolve=True),
        "out_dir": str(out_dir),
    }
    if setup.config.distributed.world_size > 1:
        meta["claim"]["distributed"] = distributed_claim(setup)
    return meta
