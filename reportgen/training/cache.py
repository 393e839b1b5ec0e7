"""A content-addressed disk cache of the plain twin's budget training runs, shared by a sweep's jobs
(docs/sweeps.md, "The plain twin is trained once per sweep"): the key is :mod:`reportgen.training.cache_key`'s,
the HMAC's secret :mod:`reportgen.training.cache_secret`'s. An entry is data only (``<key>.json`` and a
``<key>.<sha256>.pt`` of tensors read with ``weights_only=True``) and proves itself by the plain run's first
training step (:func:`fingerprint`); an entry that fails any check is :class:`Rejected`, never a hit."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from reportgen.files import sha256_file
from reportgen.training.cache_key import FORMAT
from reportgen.trust.sources import canonical_sha256, digest_files, user_source_digests

log = logging.getLogger("reportgen")

ENV = "REPORTGEN_CACHE_DIR"
#: Fields of a stored run's numbers (``reportgen.training.loop.TrainResult`` without its tensors).
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


def cache_dir(enabled: bool = True) -> Path | None:
    """The cache folder for this process, or ``None`` when caching is off: ``cache.enabled=false`` or
    ``$REPORTGEN_CACHE_DIR=off``; else that variable when set, else ``<hydra.sweep.dir>/.reportgen-cache`` in a
    multirun (a single run without the variable caches nothing).

    Args:
        enabled: ``cache.enabled`` (False turns the cache off).
    """
    if not enabled:
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


def entry_digest(entry: dict, secret: bytes) -> str:
    """Hex HMAC-SHA256, keyed with ``secret``, of an entry's canonical JSON without its ``digest``
    field (what ``digest`` holds)."""
    text = json.dumps(
        {k: v for k, v in entry.items() if k != "digest"}, sort_keys=True, separators=(",", ":"), default=str
    )
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def fingerprint(setup, seed: int, batch_size: int) -> dict[str, str]:
    """The plain run's first training step, made afresh: one forward and backward of a new plain twin
    of ``setup`` (uncompiled: compiling is in the key) on the run's first batch (``seed``, ``batch_size``
    capped at the budget) under its forward seed, as :func:`reportgen.training.loop.train_to_budget` does.

    Returns:
        ``{"loss": repr of the loss, "gradients": hex SHA-256 of every trainable parameter's name,
        dtype, shape and gradient bytes, in order}``: equal only when bitwise equal.

    Raises:
        Exception: whatever building the twin, drawing the batch, the forward or backward raise.
    """
    import torch

    from reportgen.training.loop import step_seed
    from reportgen.twins.snapshot import grads_of

    batch = setup.make_batch(min(int(batch_size), int(setup.config.budget.examples)), int(seed))
    forward = setup.config.forward_seed
    rng = int(seed) if forward is None else step_seed(forward, seed, 0)  # forward_seed null: seed_all(seed) once
    twin = setup.twin(False, compiled=False)
    loss = twin.step(batch, rng, accept=False, rng=False).loss
    digest = hashlib.sha256()
    for name, grad in grads_of(twin.model, clone=False).items():
        digest.update(f"{name} {None if grad is None else (grad.dtype, tuple(grad.shape))}\n".encode())
        if grad is not None:
            digest.update(grad.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return {"loss": repr(float(loss)), "gradients": digest.hexdigest()}


def load(folder: Path, key: str, secret: bytes, proof: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The entry under ``key``: ``(record, tensors)``, or None when there is none or it is stale.

    ``record`` holds :data:`RECORD_FIELDS`; ``tensors`` is ``{name: torch.Tensor}``. A stale
    entry (a user source loaded during that training run has changed since) is a miss.
    ``secret`` is :func:`cache_secret`; ``proof`` is this run's :func:`fingerprint`.

    Raises:
        Rejected: an entry exists but fails a check (its digest, its key material, its fingerprint,
            its tensor file's digest, ``weights_only`` loading, its shape); the message says which.
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
    then = entry.get("fingerprint")
    then = then if isinstance(then, dict) else {}
    if then != proof:
        field, name = ("loss", "loss") if then.get("loss") != proof["loss"] else ("gradients", "gradient sha256")
        raise Rejected(
            f"the plain twin's first training step differs from the one stored with it ({name} {then.get(field)} "
            f"then, {proof[field]} now): an input the key does not cover has changed (e.g. data read at import)"
        )
    tensors_info = entry.get("tensors") or {}
    tensor_file = Path(folder) / str(tensors_info.get("file", ""))
    if tensor_file.parent != Path(folder) or not tensor_file.is_file():
        raise Rejected("its tensor file is missing")
    try:
        tensor_digest = sha256_file(tensor_file)
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
    if not isinstance(record, dict) or not _valid_record(record):
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
    proof: dict[str, str],
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
        proof: the run's :func:`fingerprint`, which every later hit must match bitwise.
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
        "tensors": {"file": tensor_name, "sha256": sha256_file(folder / tensor_name)},
        "sources_loaded": user_source_digests(modules),
        "files_opened": digest_files(opened or []),
        "fingerprint": proof,
    }
    entry["digest"] = entry_digest(entry, secret)
    _atomic_write(folder / f"{key}.json", lambda handle: handle.write(json.dumps(entry, sort_keys=True).encode()))
