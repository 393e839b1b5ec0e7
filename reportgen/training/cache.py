"""A content-addressed disk cache of the plain twin's budget training runs, shared by a sweep's jobs.

**The key** is the SHA-256 of every input that can change the plain twin's training result:

- the whole composed config except the groups that only the recompute twin or the output
  reads (:data:`NOT_IN_KEY`: ``recompute``, ``report``, ``verdict``, ``claim``, ``cache``); so
  precision and autocast, ``compile.*``, dtype, device, seeds, budget, optimizer, task and
  model arguments are in, and so is any setting added later (a deny-list, not an allow-list);
- the run's own seed, batch size and learning-rate factor, the device and its kind (GPU name);
- reportgen's version and the SHA-256 of its source, and the python, torch, numpy and
  transformers versions;
- the SHA-256 of every user source file, read from ``sys.modules`` after the model and task
  were built (:mod:`reportgen.trust.sources`): whatever the package layout (a namespace package
  without ``__init__.py``, a library imported from another folder), an edit is a miss;
- the SHA-256 of the contents of every file the config names (``model.config``, every file of
  a ``model.pretrained`` folder, ``task.text_file``, a user task's data file: any config string
  that is a path on disk; ``reportgen.trust.sources.named_file_digests``): the same path with
  edited contents (SiLU → GELU in config.json) is a miss, never the stale run.

**An entry is data only**: ``<key>.json`` (the key material, the run's numbers, the digest of
the tensor file, the user sources loaded by the end of training, and a SHA-256 ``digest`` over
all of it) and ``<key>.<sha256>.pt`` (the trained parameters, a ``{name: tensor}`` dict written
by ``torch.save`` and read with ``torch.load(weights_only=True)``: no object is ever unpickled).
On load the digest, the key material, the tensor file's digest and the tensors themselves are
checked; any failure is a :class:`Rejected` entry that the caller reports as a WARN row and
replaces by a fresh training run, never a hit.

The digest is an HMAC-SHA256 keyed with the user's cache secret (:func:`cache_secret`: 32
random bytes in ``~/.config/reportgen/cache-secret``, mode 0600, made on first use; or the file
``$REPORTGEN_CACHE_SECRET`` names). It catches edited bytes, truncated files, entries moved
between keys (the recompute twin's run stored under the plain twin's key), and entries written
by anyone who does not hold the secret, such as another user of a shared sweep folder: they are
rejected, never used. Jobs that share a cache must share the secret (the same home folder, or
``$REPORTGEN_CACHE_SECRET``).

Where: nowhere when ``cache.enabled=false`` or ``$REPORTGEN_CACHE_DIR=off``; else
``$REPORTGEN_CACHE_DIR`` when set, else, in a Hydra multirun, ``<hydra.sweep.dir>/.reportgen-cache``;
a single run without the variable caches nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import importlib.metadata
import json
import logging
import os
import platform
import secrets
import tempfile
from pathlib import Path
from typing import Any

from reportgen import __version__
from reportgen.files import special_kind
from reportgen.trust.sources import (
    canonical_sha256,
    digest_files,
    file_sha256,
    named_file_digests,
    reportgen_sources_sha256,
    user_source_digests,
)

log = logging.getLogger("reportgen")

ENV = "REPORTGEN_CACHE_DIR"
#: Names the file holding the cache secret (default ``~/.config/reportgen/cache-secret``).
SECRET_ENV = "REPORTGEN_CACHE_SECRET"
#: Bytes of a new cache secret; a shorter file is refused.
SECRET_BYTES = 32
#: Bump when the layout of a cache entry changes (old entries then have other keys: misses).
FORMAT = 2
#: Config groups left out of the key: read only for the recompute twin or for the output.
NOT_IN_KEY = ("recompute", "report", "verdict", "claim", "cache", "checks", "run", "hydra")
#: Fields of a stored run's numbers (``reportgen.training.train.TrainResult`` without its tensors).
RECORD_FIELDS = (
    "metrics",
    "accepted_examples",
    "steps",
    "skipped_steps",
    "skipped_examples",
    "curve",
    "lr",
    "batch_size",
    "seconds",
    "complete",
)


class Rejected(Exception):
    """A cache entry exists under the key but cannot be trusted (digest mismatch, unreadable,
    stored for other inputs, refused by ``weights_only`` loading); the message says which."""


def cache_enabled(cfg) -> bool:
    """``cfg.cache.enabled`` (True when the config has no ``cache`` group)."""
    group = cfg.get("cache") if hasattr(cfg, "get") else None
    return bool(group.get("enabled", True)) if group is not None else True


def cache_dir(cfg=None) -> Path | None:
    """The cache folder for this process, or ``None`` when caching is off (see module docstring).

    Args:
        cfg: the composed config; ``cache.enabled=false`` turns the cache off.
    """
    if cfg is not None and not cache_enabled(cfg):
        return None
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


def key_config(cfg) -> dict:
    """The composed config as plain data (interpolations resolved) without :data:`NOT_IN_KEY`."""
    from omegaconf import OmegaConf

    config = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    return {k: v for k, v in config.items() if k not in NOT_IN_KEY}


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
    cfg,
    device: Any,
    dtype: Any,
    seed: int,
    batch_size: int,
    lr_scale: float,
    modules: dict | None = None,
    twin: str = "plain",
) -> tuple[str, dict]:
    """The cache key of a plain budget run, and the material it hashes (see module docstring).

    Args:
        cfg: the composed run config.
        device: ``torch.device`` (or its name) the run trains on.
        dtype: ``torch.dtype`` of both twins.
        seed: the training run's seed (data order, dropout).
        batch_size: examples per step.
        lr_scale: learning-rate factor.
        modules: the module table whose user sources are hashed (default ``sys.modules``).
        twin: ``"plain"``, or ``"rounding"`` for the rounding twin's run (a plain twin with
            tolerance-sized gradient noise, :mod:`reportgen.results.rounding`): its own key.

    Returns:
        ``(hex SHA-256 of the canonical JSON of the material, material)``.
    """
    import numpy
    import torch

    config = key_config(cfg)
    _import_targets(config)
    material = {
        "format": FORMAT,
        "config": config,
        "device": {"name": str(device), "kind": device_kind(device)},
        "dtype": str(dtype),
        "run": {
            "seed": int(seed),
            "batch_size": int(batch_size),
            "lr_scale": float(lr_scale),
            **({} if twin == "plain" else {"twin": twin}),
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "numpy": numpy.__version__,
            "transformers": _version("transformers"),
            "reportgen": __version__,
        },
        "sources": {"reportgen": reportgen_sources_sha256(), "user": user_source_digests(modules)},
        "files": named_file_digests(config),  # contents, not paths: an edited config.json is a miss
    }
    material = json.loads(json.dumps(material, sort_keys=True, default=str))
    return canonical_sha256(material), material


def secret_path() -> Path:
    """Where the cache secret is: ``$REPORTGEN_CACHE_SECRET``, else ``~/.config/reportgen/cache-secret``."""
    configured = os.environ.get(SECRET_ENV, "").strip()
    return Path(configured or "~/.config/reportgen/cache-secret").expanduser()


def cache_secret() -> bytes:
    """The key of every entry's HMAC: the bytes of :func:`secret_path`, made on first use
    (:data:`SECRET_BYTES` random bytes, mode 0600; two jobs making it at once agree on one).

    Raises:
        OSError: the file cannot be read or made, or holds fewer than 16 bytes.
        CacheSecretError: it is not the user's own 0600 regular file (:func:`check_secret_file`).
    """
    path = secret_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(SECRET_BYTES))
            os.link(tmp, path)  # atomic: fails when another job made it first
        except FileExistsError:
            pass
        finally:
            Path(tmp).unlink(missing_ok=True)
    check_secret_file(path)
    data = path.read_bytes()
    if len(data) < 16:
        raise OSError(
            f"the cache secret {path} holds {len(data)} bytes (at least 16 needed); delete it and a new one is made"
        )
    return data


class CacheSecretError(OSError):
    """The cache secret is not the user's own private file; the message names the fix (``chmod 600``)."""


def check_secret_file(path: Path) -> None:
    """The cache secret must be a regular file of this user with mode 0600, like the signing key:
    whoever can read it can write cache entries whose HMAC verifies.

    Raises:
        CacheSecretError: a device or FIFO, another user's file, or readable/writable by others.
    """
    kind = special_kind(path)
    if kind:
        raise CacheSecretError(
            f"the cache secret {path} is {kind}, not a regular file; point "
            f"{SECRET_ENV} at a file of your own (mode 0600), or unset it"
        )
    info = path.stat()
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise CacheSecretError(
            f"the cache secret {path} belongs to another user (uid {info.st_uid}); it must be "
            f"your own file (mode 0600): point {SECRET_ENV} at one, or unset it"
        )
    mode = info.st_mode & 0o777
    if mode & 0o077:
        raise CacheSecretError(
            f"the cache secret {path} is accessible by others (mode {mode:04o}): anyone who can "
            f"read it can write cache entries reportgen accepts. Run `chmod 600 {path}` (and delete "
            "the cache folder if others may have read it)"
        )


def entry_digest(entry: dict, secret: bytes) -> str:
    """Hex HMAC-SHA256, keyed with ``secret``, of an entry's canonical JSON without its ``digest``
    field (what ``digest`` holds)."""
    text = json.dumps(
        {k: v for k, v in entry.items() if k != "digest"}, sort_keys=True, separators=(",", ":"), default=str
    )
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def load(folder: Path, key: str, secret: bytes) -> tuple[dict, dict] | None:
    """The entry under ``key``: ``(record, tensors)``, or None when there is none or it is stale.

    ``record`` holds :data:`RECORD_FIELDS`; ``tensors`` is ``{name: torch.Tensor}``. A stale
    entry (a user source loaded during that training run has changed since) is a miss.
    ``secret`` is :func:`cache_secret`.

    Raises:
        Rejected: an entry exists but fails a check (its digest, its key material, its tensor
            file's digest, ``weights_only`` loading, its shape); the message says which.
    """
    import torch

    meta = Path(folder) / f"{key}.json"
    if not meta.exists():
        return None
    try:
        entry = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Rejected(f"its JSON is unreadable ({type(exc).__name__})") from None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT or not isinstance(entry.get("digest"), str):
        raise Rejected(f"it is not a format-{FORMAT} entry")
    if not hmac.compare_digest(entry_digest(entry, secret), entry["digest"]):
        raise Rejected(
            "digest mismatch: the entry was edited after it was written, or written by someone "
            "without your cache secret"
        )
    if entry.get("key") != key or canonical_sha256(entry.get("material")) != key:
        raise Rejected(f"it was stored for other inputs (key sha256:{str(entry.get('key'))[:16]}…), not for this run's")
    loaded = entry.get("sources_loaded") or {}
    opened = entry.get("files_opened") or {}
    if not isinstance(loaded, dict) or not isinstance(opened, dict):
        raise Rejected("its list of loaded sources or opened files is not a {path: digest} map")
    loaded = {**loaded, **opened}  # a data file the task read while training counts as a source
    stale = [
        path for path, digest in loaded.items() if not Path(path).is_file() or digest_files([path])[path] != digest
    ]  # never a device or FIFO
    if stale:
        log.info("cache entry %s is stale (%s changed since it was trained); training instead", key, stale[0])
        return None
    tensors_info = entry.get("tensors") or {}
    tensor_file = Path(folder) / str(tensors_info.get("file", ""))
    if tensor_file.parent != Path(folder) or not tensor_file.is_file():
        raise Rejected("its tensor file is missing")
    try:
        tensor_digest = file_sha256(tensor_file)
    except OSError as exc:
        raise Rejected(f"its tensor file is unreadable ({type(exc).__name__})") from None
    if tensor_digest != tensors_info.get("sha256"):
        raise Rejected("digest mismatch: its tensor file was edited after it was written")
    try:
        tensors = torch.load(tensor_file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch.load's refusals vary by version
        raise Rejected(
            f"its tensor file was refused by torch.load(weights_only=True) ({type(exc).__name__}): "
            "it holds something other than tensors, and was not unpickled"
        ) from None
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise Rejected("its tensor file does not hold a {name: tensor} dict")
    record = entry.get("record")
    if not _valid_record(record):
        raise Rejected("its record does not hold the fields of a training run")
    return record, tensors


def _valid_record(record: Any) -> bool:
    """True when ``record`` has exactly :data:`RECORD_FIELDS` with the types a training run writes."""
    if not isinstance(record, dict) or set(record) != set(RECORD_FIELDS):
        return False
    number = (int, float)
    counts = ("accepted_examples", "steps", "skipped_steps", "skipped_examples", "batch_size")
    return (
        isinstance(record["metrics"], dict)
        and all(isinstance(k, str) and isinstance(v, number) for k, v in record["metrics"].items())
        and all(isinstance(record[k], int) and not isinstance(record[k], bool) for k in counts)
        and isinstance(record["lr"], number)
        and isinstance(record["seconds"], number)
        and isinstance(record["complete"], bool)
        and isinstance(record["curve"], list)
        and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, number) for x in p) for p in record["curve"])
    )


def _atomic_write(path: Path, write) -> None:
    """Write ``path`` through a temporary file in its folder and ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def store(
    folder: Path,
    key: str,
    material: dict,
    record: dict,
    tensors: dict,
    secret: bytes,
    modules: dict | None = None,
    opened: list | None = None,
) -> None:
    """Write an entry under ``key`` (tensor file first, then the JSON that names it; each atomic,
    so two jobs storing the same key at once leave one whole entry).

    Args:
        folder: the cache folder (created when missing).
        key, material: from :func:`plain_run_key`.
        record: the run's numbers, :data:`RECORD_FIELDS` (JSON-able; NaN allowed).
        tensors: ``{name: torch.Tensor}`` (CPU).
        secret: :func:`cache_secret`, the key of the entry's HMAC.
        modules: module table whose user sources are recorded as loaded by the end of
            training (default ``sys.modules``).
        opened: data files the model or task read while training (``reportgen.trust.opened``);
            their digests are kept, and a later change makes the entry stale.

    Raises:
        OSError: the folder cannot be written.
    """
    import io

    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save({k: v.detach().to("cpu") for k, v in tensors.items()}, buffer)
    data = buffer.getvalue()
    tensor_name = f"{key}.{hashlib.sha256(data).hexdigest()[:16]}.pt"
    _atomic_write(folder / tensor_name, lambda handle: handle.write(data))
    entry = {
        "format": FORMAT,
        "key": key,
        "material": material,
        "record": json.loads(json.dumps({k: record[k] for k in RECORD_FIELDS})),
        "tensors": {"file": tensor_name, "sha256": file_sha256(folder / tensor_name)},
        "sources_loaded": user_source_digests(modules),
        "files_opened": digest_files(opened or []),
    }
    entry["digest"] = entry_digest(entry, secret)
    _atomic_write(folder / f"{key}.json", lambda handle: handle.write(json.dumps(entry, sort_keys=True).encode()))
