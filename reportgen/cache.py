"""A content-addressed disk cache of the plain twin's budget training runs, shared by a sweep's jobs.

The plain twin's training to the accepted-example budget depends only on the model and task
(their config and the source files of their code), the seeds, the budget and its optimizer,
precision, device, reportgen's own training code and the library versions. Jobs of a sweep
over recompute settings (implementation, targets, preserve_rng_state, ...) share all of
those, so the first job trains the plain twin and stores the result under the SHA-256 of
exactly those inputs; later jobs load it. Any change to an input changes the key, so a stale
entry cannot be hit; the full key material is stored beside each entry and compared on load.

Where: ``$REPORTGEN_CACHE_DIR`` when set (``off`` disables it), else, in a Hydra multirun,
``<hydra.sweep.dir>/.reportgen-cache``; a single run without the variable caches nothing.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("reportgen")

ENV = "REPORTGEN_CACHE_DIR"
#: Bump when the layout of a cache entry changes.
FORMAT = 1


def cache_dir() -> Path | None:
    """The cache folder for this process, or ``None`` when caching is off (see module docstring)."""
    configured = os.environ.get(ENV, "").strip()
    if configured.lower() == "off":
        return None
    if configured:
        return Path(configured).expanduser()
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            return Path(HydraConfig.get().sweep.dir) / ".reportgen-cache"
    except (ImportError, ValueError):
        pass
    return None


def _package_files(target: str) -> list[Path]:
    """Source files of the code behind a ``_target_`` (``pkg.mod.fn``): every ``.py`` of its
    top-level package, or for a top-level module its file and the loaded modules beside it."""
    top = target.split(".")[0]
    module = sys.modules.get(top)
    if module is None:
        __import__(top)
        module = sys.modules[top]
    path = getattr(module, "__file__", None)
    if path is None:
        return []
    path = Path(path).resolve()
    if path.name == "__init__.py":
        return sorted(path.parent.rglob("*.py"))
    beside = {Path(m.__file__).resolve() for m in list(sys.modules.values())
              if getattr(m, "__file__", None) and Path(m.__file__).resolve().parent == path.parent}
    return sorted(beside | {path})


def _digest_files(files: list[Path]) -> dict[str, str]:
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def plain_run_key(cfg, device: Any, dtype: Any, seed: int, batch_size: int, lr_scale: float) -> tuple[str, dict]:
    """The cache key of a plain budget run, and the material it hashes.

    Args:
        cfg: the composed run config (``model``, ``task``, ``budget``, ``seed``, ``forward_seed``, ``dtype``).
        device: ``torch.device`` the run trains on.
        dtype: ``torch.dtype`` of both twins.
        seed: the training run's seed (data order, dropout).
        batch_size: examples per step.
        lr_scale: learning-rate factor.

    Returns:
        ``(hex SHA-256 of the canonical JSON of the material, material)``.
    """
    import numpy
    import torch
    from omegaconf import OmegaConf

    from . import __version__

    budget = OmegaConf.to_container(cfg.budget, resolve=True)
    material = {
        "format": FORMAT,
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "task": OmegaConf.to_container(cfg.task, resolve=True),
        "weights_seed": cfg.seed, "forward_seed": cfg.forward_seed, "dtype": str(dtype), "device": str(device),
        "budget": {k: budget.get(k) for k in ("examples", "optimizer", "eval_every", "max_steps_factor")},
        "run": {"seed": int(seed), "batch_size": int(batch_size), "lr_scale": float(lr_scale)},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
                     "reportgen": __version__},
        "sources": _digest_files(sorted({*_package_files(str(cfg.model._target_)),
                                         *_package_files(str(cfg.task._target_)), *_package_files("reportgen")})),
    }
    text = json.dumps(material, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), material


def load(folder: Path, key: str, material: dict):
    """The cached result under ``key``, or ``None`` (absent, unreadable, or stored for other inputs)."""
    import torch

    entry, meta = folder / f"{key}.pt", folder / f"{key}.json"
    if not entry.exists() or not meta.exists():
        return None
    try:
        if json.loads(meta.read_text()) != json.loads(json.dumps(material, sort_keys=True, default=str)):
            return None
        return torch.load(entry, weights_only=False)  # a local cache this user's runs wrote
    except Exception:  # noqa: BLE001 - a broken entry is a miss, never a wrong result
        log.warning("cache entry %s is unreadable; training instead", entry)
        return None


def store(folder: Path, key: str, material: dict, result: Any) -> None:
    """Write ``result`` under ``key`` atomically (two jobs storing the same key at once is harmless)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    for suffix, write in ((".pt", lambda handle: torch.save(result, handle)),
                          (".json", lambda handle: handle.write(json.dumps(material, sort_keys=True, default=str).encode()))):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}{suffix}.")
        try:
            with os.fdopen(fd, "wb") as handle:
                write(handle)
            os.replace(tmp, folder / f"{key}{suffix}")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def plain_run(setup, seed: int, batch_size: int, lr_scale: float, train):
    """The plain twin's budget run: from the cache when an entry has exactly these inputs, else
    trained by ``train()`` and stored (complete runs only). Logs ``from cache`` with the key.

    Args:
        setup: the run's :class:`reportgen.setup.Setup` (config, device, dtype).
        seed, batch_size, lr_scale: as for :meth:`reportgen.train.BudgetRuns.get`.
        train: trains the plain twin and returns its :class:`reportgen.train.TrainResult`.

    Returns:
        The result; a cached one carries ``cache_key`` (hex SHA-256), a trained one ``None``.
    """
    folder = cache_dir()
    if folder is None:
        return train()
    key, material = plain_run_key(setup.cfg, setup.device, setup.dtype, seed, batch_size, lr_scale)
    result = load(folder, key, material)
    if result is not None:
        log.info("plain twin, seed %d, batch %d: from cache (key sha256:%s in %s)", seed, batch_size, key, folder)
        result.cache_key = key
        return result
    result = train()
    if getattr(result, "complete", True):
        store(folder, key, material, result)
    result.cache_key = None
    return result
