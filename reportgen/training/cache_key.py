"""The key of a plain-twin cache entry (:mod:`reportgen.training.cache`; what it covers: docs/sweeps.md, "The
plain twin is trained once per sweep"): the SHA-256 of the config minus :data:`NOT_IN_KEY` (a deny-list, so a
setting added later is in), the run's seed, batch and learning-rate factor, the device kind, versions, the digests
of reportgen's and the user's sources, and of the contents of every file the config names
(``reportgen.trust.sources.named_file_digests``: an edited config.json is a miss, never the stale run)."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.metadata
import json
import platform
from typing import Any

from reportgen import __version__
from reportgen.config import Config
from reportgen.trust.sources import canonical_sha256, named_file_digests, reportgen_sources_sha256, user_source_digests

#: Bump when the layout of a cache entry changes (old entries then have other keys: misses).
FORMAT = 5
#: Config groups left out of the key: read only for the recompute twin or for the output.
NOT_IN_KEY = ("recompute", "report", "verdict", "claim", "cache", "checks", "run", "hydra")


def key_config(config: Config) -> dict:
    """The run's typed config as plain data without :data:`NOT_IN_KEY` (an enum as its value)."""
    data = dataclasses.asdict(config)
    plain = json.loads(json.dumps(data, default=lambda v: v.value if isinstance(v, enum.Enum) else str(v)))
    return {k: v for k, v in plain.items() if k not in NOT_IN_KEY}


def _import_targets(node: Any) -> None:
    """Import the module of every ``_target_`` in ``node`` so that its source is in ``sys.modules``
    (building the model and task already did; this covers a key computed before building)."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and "." in target:
            try:
                importlib.import_module(target.rsplit(".", 1)[0])
            except Exception:  # noqa: BLE001 - a target that cannot import fails the build, not the key
                pass
        for value in node.values():
            _import_targets(value)
    elif isinstance(node, list):
        for value in node:
            _import_targets(value)


def device_kind(device: Any) -> str:
    """What the device is, beyond its index: the GPU's name and compute capability on CUDA; the
    machine architecture and the vector instructions torch's CPU kernels dispatch to otherwise
    (they round differently), e.g. ``"NVIDIA H200 (sm 9.0)"``, ``"cpu x86_64 AVX2"``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (sm {major}.{minor})"
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "")()
    return f"{device.type} {platform.machine()} {capability}".strip()


def _version(distribution: str) -> str | None:
    """An installed distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def plain_run_key(
    config: Config,
    device: Any,
    dtype: Any,
    seed: int,
    batch_size: int,
    lr_scale: float,
    modules: dict | None = None,
) -> tuple[str, dict]:
    """The cache key of a plain budget run, and the material it hashes (see module docstring).

    Args:
        config: the run's typed config (:class:`reportgen.config.Config`).
        device: ``torch.device`` (or its name) the run trains on.
        dtype: ``torch.dtype`` of both twins.
        seed: the training run's seed (data order, dropout).
        batch_size: examples per step.
        lr_scale: learning-rate factor.
        modules: the module table whose user sources are hashed (default ``sys.modules``).

    Returns:
        ``(hex SHA-256 of the canonical JSON of the material, material)``.
    """
    import numpy
    import torch

    keyed = key_config(config)
    _import_targets(keyed)
    material = {
        "format": FORMAT,
        "config": keyed,
        "device": {"name": str(device), "kind": device_kind(device)},
        "dtype": str(dtype),
        "run": {"seed": int(seed), "batch_size": int(batch_size), "lr_scale": float(lr_scale)},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "numpy": numpy.__version__,
            "transformers": _version("transformers"),
            "reportgen": __version__,
        },
        "sources": {"reportgen": reportgen_sources_sha256(), "user": user_source_digests(modules)},
        "files": named_file_digests(keyed),  # contents, not paths: an edited config.json is a miss
    }
    material = json.loads(json.dumps(material, sort_keys=True, default=str))
    return canonical_sha256(material), material
