"""A content-addressed disk cache of the plain twin's budget training runs, shared by a sweep's jobs
(docs/sweeps.md, "The plain twin is trained once per sweep"): the key is :mod:`reportgen.training.cache_key`'s,
the HMAC's secret :mod:`reportgen.training.cache_secret`'s. An entry is data only (``<key>.json`` and a
``<key>.<sha256>.pt`` of tensors read with ``weights_only=True``) and proves itself by the bytes it consumed:
the plain run's first training step (:func:`fingerprint`), the SHA-256 of every training batch it drew (drawn
again, data only: :func:`draw_digests`) and its weights evaluated once with this run's own evaluation
(:func:`weights_evaluation`), each bitwise equal to what it stored; an entry that fails any check is
:class:`Rejected`, never a hit."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
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


def batch_sha256(batch: Any) -> str:
    """Hex SHA-256 of a batch as the task drew it: every tensor leaf's path, dtype, shape and bytes (dense,
    on the host), and every other leaf's text (:mod:`reportgen.structure`), in order; equal only when bitwise
    equal."""
    import torch

    from reportgen.structure import named_tensors, other_leaves

    digest = hashlib.sha256()
    for name, tensor in named_tensors(batch, "batch"):
        tensor = tensor.detach()
        tensor = tensor.to_dense() if tensor.layout != torch.strided else tensor
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode())
        digest.update(tensor.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    digest.update(json.dumps(other_leaves(batch, "batch"), sort_keys=True, default=str).encode())
    return digest.hexdigest()


def recorder(draws: list[list]) -> Callable[[int, Any], None]:
    """The ``on_batch`` hook of :func:`reportgen.training.loop.train_to_budget` that appends
    ``[examples asked for, batch_sha256]`` of each drawn batch to ``draws`` (what an entry stores)."""
    return lambda wanted, batch: draws.append([int(wanted), batch_sha256(batch)])


def draw_digests(setup, seed: int, sizes: list[int]) -> list[str]:
    """The training batches of the plain run with data seed ``seed``, drawn again without any model work: the
    task's ``make_batch`` with a generator seeded as :func:`reportgen.training.loop.train_to_budget` seeds it,
    asked for ``sizes`` examples in turn (skipped steps included), each hashed by :func:`batch_sha256`; every
    global generator seeded with ``seed`` meanwhile and restored after.

    Raises:
        Exception: whatever the task's ``make_batch`` raises.
    """
    import torch

    from reportgen.rng import seeded

    generator = torch.Generator().manual_seed(int(seed))
    with seeded(int(seed)):
        return [batch_sha256(setup.task.make_batch(generator, int(n))) for n in sizes]


def weights_evaluation(setup, tensors: dict[str, Any], seed: int) -> dict[str, str]:
    """``tensors`` (``{plain parameter name: tensor}``, a run's trained weights) loaded into a new plain twin of
    ``setup`` (uncompiled) and evaluated once with this run's own evaluation
    (:func:`reportgen.training.loop.evaluate`), every generator seeded with ``seed``.

    Returns:
        ``{metric: repr of its value}``: equal only when bitwise equal.

    Raises:
        KeyError: a parameter of the twin is not in ``tensors``.
        Exception: whatever building the twin or the task's ``evaluate`` raise.
    """
    import torch

    from reportgen.rng import seeded
    from reportgen.training.loop import evaluate
    from reportgen.twins.recompute import plain_name

    model = setup.twin(False, compiled=False).model
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(tensors[plain_name(name)])
    with seeded(int(seed)):
        return {name: repr(float(value)) for name, value in sorted(evaluate(model, setup.task).items())}


@dataclass(frozen=True)
class Replay:
    """What a run redoes to prove an entry, beside its first step: ``batches(sizes) -> [sha256]`` draws its
    training batches again (:func:`draw_digests`), ``evaluation(tensors) -> {metric: repr}`` evaluates its
    weights (:func:`weights_evaluation`)."""

    batches: Callable[[list[int]], list[str]]
    evaluation: Callable[[dict[str, Any]], dict[str, str]]


def _check_draws(stored: Any, replay: Replay) -> int:
    """Rejected unless the stored ``[[examples, sha256], ...]`` are the batches this run draws, bitwise;
    the number of batches drawn."""
    if (
        not isinstance(stored, list)
        or not stored
        or not all(
            isinstance(d, list) and len(d) == 2 and isinstance(d[0], int) and isinstance(d[1], str) for d in stored
        )
    ):
        raise Rejected("it holds no digests of the training batches it consumed")
    try:
        now = replay.batches([n for n, _ in stored])
    except Exception as exc:  # noqa: BLE001 - a task that cannot draw again cannot prove the entry
        raise Rejected(f"drawing its training batches again raised {type(exc).__name__}: {exc}") from None
    for k, ((n, then), digest) in enumerate(zip(stored, now, strict=True), 1):
        if then != digest:
            raise Rejected(
                f"training batch {k} of {len(stored)} ({n} examples) differs from the one it was trained on "
                f"(sha256 {then[:16]}… then, {digest[:16]}… now): the training data changed where the key cannot "
                "see it (e.g. data read at import)"
            )
    return len(stored)


def _check_evaluation(stored: Any, tensors: dict[str, Any], replay: Replay) -> None:
    """Rejected unless this run's evaluation of the entry's weights is bitwise the stored one."""
    if not isinstance(stored, dict) or not stored:
        raise Rejected("it holds no evaluation of its weights")
    try:
        now = replay.evaluation(tensors)
    except Exception as exc:  # noqa: BLE001 - weights this run cannot evaluate cannot be proven
        raise Rejected(f"evaluating its weights raised {type(exc).__name__}: {exc}") from None
    if now != stored:
        name = next((m for m in sorted(set(stored) | set(now)) if stored.get(m) != now.get(m)), "?")
        raise Rejected(
            f"the evaluation of its weights differs from the one stored with it ({name} {stored.get(name)} then, "
            f"{now.get(name)} now, with this run's evaluation): the held-out data or the evaluation changed where "
            "the key cannot see it (e.g. a validation split read at import)"
        )


def load(
    folder: Path, key: str, secret: bytes, proof: dict[str, str], replay: Replay
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The entry under ``key``: ``(record, tensors)``, or None when there is none or it is stale.

    ``record`` holds :data:`RECORD_FIELDS` and ``draws``, the training batches drawn to prove it; ``tensors``
    is ``{name: torch.Tensor}``. A stale entry (a user source loaded during that training run has changed
    since) is a miss. ``secret`` is :func:`cache_secret`; ``proof`` is this run's :func:`fingerprint`;
    ``replay`` draws this run's training batches and evaluates the entry's weights (:class:`Replay`).

    Raises:
        Rejected: an entry exists but fails a check (its digest, its key material, its fingerprint,
            a training batch, its tensor file's digest, ``weights_only`` loading, its shape, the
            evaluation of its weights); the message says which.
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
    drawn = _check_draws(entry.get("draws"), replay)
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
    _check_evaluation(entry.get("evaluation"), tensors, replay)
    return {**record, "draws": drawn}, tensors


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
    *,
    draws: list[list],
    evaluation: dict[str, str],
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
        draws: ``[[examples asked for, batch_sha256], ...]`` of every batch the run drew (:func:`recorder`),
            which every later hit must draw again bitwise.
        evaluation: :func:`weights_evaluation` of ``tensors``, which every later hit must redo bitwise.

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
        "draws": draws,
        "evaluation": evaluation,
    }
    entry["digest"] = entry_digest(entry, secret)
    _atomic_write(folder / f"{key}.json", lambda handle: handle.write(json.dumps(entry, sort_keys=True).encode()))
