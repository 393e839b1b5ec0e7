"""A sweep's launch, as Hydra recorded it: which jobs it made, with which overrides.

Hydra's basic sweeper saves the sweep's whole config as ``multirun.yaml`` before it launches any
job, then expands the sweep (``hydra.sweeper.params`` and ``hydra.overrides.task``) with
``BasicSweeper.split_arguments`` and numbers the jobs ``0 .. N-1`` in that order. This module
re-derives that job set with Hydra's own parser and splitter, so ``reportgen.sweep summarize`` and
``reportgen.verify`` can name each missing, extra, duplicated or foreign job (each job's statement
names its launch: :func:`job_launch`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reportgen.files import sha256_file

#: Hydra's record of a multirun, in the sweep folder.
LAUNCH_FILE = "multirun.yaml"
#: The sweeper whose job set follows from its config alone (Hydra's default).
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


class LaunchError(Exception):
    """The launch cannot be re-derived (no ``multirun.yaml``, another sweeper); the message names why."""


def launch_record(sweep_dir: str | Path) -> dict[str, Any]:
    """The jobs a sweep's launch made, re-derived from its ``multirun.yaml`` (in ``hydra.sweep.dir``) as Hydra does.

    Returns:
        ``{"file", "sha256", "sweeper", "swept": {key: [values]}, "job_count", "jobs": [{"job",
        "overrides"}]}``; ``jobs[i]["overrides"]`` is what Hydra passes job ``i`` (its
        ``.hydra/overrides.yaml``).

    Raises:
        LaunchError: ``multirun.yaml`` is missing or unreadable, or the sweep used a sweeper
            other than Hydra's basic one (its jobs do not follow from the config).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    path = Path(sweep_dir) / LAUNCH_FILE
    if not path.is_file() or path.is_symlink():
        raise LaunchError(f"{path} is missing: Hydra's record of the launch is what fixes the sweep's jobs")
    try:
        cfg = OmegaConf.load(path)
        sweeper = OmegaConf.select(cfg, "hydra.sweeper._target_")
        params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
        task = list(OmegaConf.select(cfg, "hydra.overrides.task") or [])
    except Exception as exc:  # noqa: BLE001 - an edited or truncated file: named, never a traceback
        raise LaunchError(f"{path} cannot be read as Hydra's launch record ({type(exc).__name__}: {exc})") from None
    if sweeper != BASIC_SWEEPER:
        raise LaunchError(
            f"{path} names sweeper {sweeper!r}; reportgen re-derives the jobs of Hydra's basic "
            "sweeper only (the default: hydra/sweeper=basic)"
        )
    try:
        parsed = OverridesParser.create().parse_overrides([*(f"{k}={v}" for k, v in params.items()), *task])
        batches = BasicSweeper.split_arguments(parsed, None)[0]
    except Exception as exc:  # noqa: BLE001 - Hydra's parser raises its own errors on an edited record
        raise LaunchError(f"{path}: Hydra cannot expand its overrides ({exc})") from None
    swept = {o.get_key_element(): list(o.sweep_string_iterator()) for o in parsed if o.is_sweep_override()}
    return {
        "file": LAUNCH_FILE,
        "sha256": sha256_file(path),
        "sweeper": sweeper,
        "swept": swept,
        "job_count": len(batches),
        "jobs": [{"job": i, "overrides": list(b)} for i, b in enumerate(batches)],
    }


def job_launch() -> dict[str, Any] | None:
    """The running job's place in its sweep, for its signed statement (``None`` outside a multirun).

    Returns:
        ``{"job", "overrides", "launch_sha256"}``: Hydra's job number and task overrides, and the
        SHA-256 of the sweep's ``multirun.yaml`` (``None`` when it cannot be read).
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra_cfg = HydraConfig.get()
    path = Path(str(hydra_cfg.sweep.dir)) / LAUNCH_FILE
    return {
        "job": int(hydra_cfg.job.num),
        "overrides": list(hydra_cfg.overrides.task),
        "launch_sha256": sha256_file(path) if path.is_file() else None,
    }


def launch_differences(launch: dict[str, Any], jobs: Iterable[dict[str, Any]]) -> list[str]:
    """Every way the jobs found differ from the jobs the launch made, one sentence each (empty: none).

    Args:
        launch: :func:`launch_record`.
        jobs: ``[{"job", "dir", "overrides"}]`` as found, optionally with ``"signed_launch"``: the
            ``sweep`` entry of the job's verified statement (``None`` for a signed job whose
            statement names no sweep; absent when the job has no statement or it was not read).

    Returns:
        Sentences naming each missing, extra, duplicated, re-numbered or foreign job.
    """
    jobs = list(jobs)
    expected = {j["job"]: list(j["overrides"]) for j in launch["jobs"]}
    counts = Counter(j["job"] for j in jobs)
    out = [
        f"job {n} appears {c} times ({', '.join(j['dir'] + '/' for j in jobs if j['job'] == n)}): a launch "
        "numbers each job once"
        for n, c in sorted(counts.items())
        if c > 1
    ]
    out += [
        f"job {n} is missing: the launch made it ({' '.join(expected[n]) or 'no overrides'}), no folder holds it"
        for n in sorted(set(expected) - set(counts))
    ]
    for job in jobs:
        where = f"job {job['job']} ({job['dir']}/)"
        if job["job"] not in expected:
            out.append(f"{where} is not one of the {launch['job_count']} jobs the launch made")
        elif list(job["overrides"]) != expected[job["job"]]:
            out.append(
                f"{where} ran with {' '.join(job['overrides']) or 'no overrides'}; the launch gave job "
                f"{job['job']} {' '.join(expected[job['job']]) or 'no overrides'}"
            )
        if "signed_launch" in job:
            out += _foreign(where, job, launch)
    return out


def _foreign(where: str, job: dict[str, Any], launch: dict[str, Any]) -> list[str]:
    """A signed job's statement must name this launch, its own number and its own overrides."""
    signed = job["signed_launch"]
    if not isinstance(signed, dict):
        return [f"{where} was signed outside any sweep (its statement names no launch): a run copied in"]
    if signed.get("launch_sha256") != launch["sha256"]:
        return [
            f"{where} was signed in another sweep (its statement names launch "
            f"sha256:{str(signed.get('launch_sha256'))[:16]}..., this sweep's {LAUNCH_FILE} is "
            f"sha256:{launch['sha256'][:16]}...)"
        ]
    if signed.get("job") != job["job"] or list(signed.get("overrides") or []) != list(job["overrides"]):
        return [
            f"{where}: its statement signs job {signed.get('job')} with "
            f"{' '.join(signed.get('overrides') or []) or 'no overrides'}, not what its job.json says"
        ]
    return []
