"""Count the bytes autograd keeps for backward (saved activations), on any device, fake tensors too.

What is counted, during one forward and the loss (no backward):

* every tensor packed by :class:`torch.autograd.graph.saved_tensors_hooks`;
* the tensor inputs of each recompute-wrapped region. Non-reentrant
  ``torch.utils.checkpoint`` keeps its inputs alive in a closure, so saved-tensor hooks
  never see them; a forward pre-hook on each ``CheckpointWrapper`` records them;
* in selective mode, the op outputs the policy saved (``MUST_SAVE``/``PREFER_SAVE``), which
  ``torch.utils.checkpoint``'s caching dispatch mode keeps in its own storage.

Each storage is counted once (a view and its base, or ``q, k, v`` split from one ``qkv``,
are one storage), with ``untyped_storage().nbytes()``; storages of parameters and buffers
are excluded (weights are not activations). References are held until the count is done,
so an address is never reused for another tensor during the measurement.

Saved-tensor hooks bypass autograd's in-place checks and change what is stored, so callers
measure memory in runs separate from the parity runs (docs/architecture.md).

Also :func:`cuda_step_peaks`, the allocator's peaks of one :class:`reportgen.twins.twin.TrainStep` on CUDA.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.utils._pytree import tree_leaves

from reportgen.memory.device_peak import reset_peaks
from reportgen.rng import seeded
from reportgen.structure import clone_inputs
from reportgen.tasks import Batch
from reportgen.twins.recompute import plain_name
from reportgen.twins.step import TrainingStep

if TYPE_CHECKING:  # setup imports nothing from here; the annotation only
    from reportgen.twins.setup import Setup

#: Key of :attr:`SavedActivations.per_module` for storages saved outside every listed module.
REST = "(rest of model)"


@dataclass
class SavedActivations:
    """What autograd keeps for backward after one forward and the loss.

    Attributes:
        total_bytes: bytes of unique storages kept for backward (parameters and buffers
            excluded), B.
        per_module: ``{module path: bytes}`` for each path asked for (recompute-wrapper
            segments removed, so plain and recompute twins share keys), plus ``REST``
            (``"(rest of model)"``) for storages saved outside all of them. Sums to
            ``total_bytes``.
        storages: number of unique storages counted.
        per_module_storages: ``{module path: number of storages}``, same keys as ``per_module``.
        produced_by: ``{module path: bytes}`` of the storages in ``per_module[REST]`` that a
            listed module produced (its output, kept by a layer outside every listed module),
            B. Not in ``per_module``: it says who *causes* them. A recompute region whose
            output the next layer keeps (a recomputed ReLU before a Linear) shows here.
    """

    total_bytes: int
    per_module: dict[str, int]
    storages: int = 0
    per_module_storages: dict[str, int] = field(default_factory=dict)
    produced_by: dict[str, int] = field(default_factory=dict)

    def caused_by(self, path: str) -> int:
        """Bytes kept because of module ``path``: saved while it runs or as its inputs, plus its
        outputs kept outside every listed module (``per_module`` + ``produced_by``), B."""
        return self.per_module.get(path, 0) + self.produced_by.get(path, 0)


def _storage_key(t: Tensor) -> tuple[Any, ...]:
    """A key equal for tensors sharing memory: ``(device, data_ptr)`` for real tensors, the
    storage object's address for fake/meta tensors (their data pointer is 0)."""
    storage = t.untyped_storage()
    if not isinstance(t, torch._subclasses.FakeTensor) and t.device.type != "meta":
        ptr = storage.data_ptr()
        if ptr:
            return (str(t.device), ptr)
    return ("storage", storage._cdata)


class _Ledger:
    """Unique storages seen so far, each with the module it is attributed to."""

    def __init__(self, excluded: set):
        self.excluded = excluded
        self.seen: dict[tuple, tuple[str, int]] = {}
        self.refs: list[Any] = []  # keep storages alive: no address reuse while counting

    def add(self, t: Any, owner: str) -> None:
        if not isinstance(t, Tensor):
            return
        key, nbytes, ref = _identify(t)
        if key in self.excluded or key in self.seen:
            return
        self.seen[key] = (owner, nbytes)
        self.refs.append(ref)


def _identify(t: Tensor) -> tuple[tuple, int, Any]:
    """``(storage key, storage bytes, object to hold)`` of a tensor (sparse and nested tensors,
    which have no plain storage, are keyed by the tensor itself)."""
    try:
        storage = t.untyped_storage()
        return _storage_key(t), int(storage.nbytes()), storage
    except (RuntimeError, NotImplementedError):
        return ("tensor", id(t)), t.numel() * t.element_size(), t


def _weight_keys(model: nn.Module) -> set:
    keys = set()
    for t in (*model.parameters(), *model.buffers()):
        with contextlib.suppress(RuntimeError, NotImplementedError):
            keys.add(_storage_key(t))
    return keys


def _tracking_context_fn(original: Callable, contexts: list, owner: Callable[[], str]) -> Callable:
    """Wrap a selective-recompute ``context_fn`` to remember each forward context's storage."""

    def context_fn():
        forward_ctx, recompute_ctx = original()
        if hasattr(forward_ctx, "storage"):
            contexts.append((owner(), forward_ctx.storage))
        return forward_ctx, recompute_ctx

    return context_fn


def _selective_saved(storage: dict) -> Iterable[Tensor]:
    """Tensors a selective policy kept: values of ``_CachingTorchDispatchMode.storage``."""
    for per_index in storage.values():
        values = per_index.values() if isinstance(per_index, dict) else per_index
        for value in values:
            for leaf in tree_leaves(value):
                leaf = getattr(leaf, "val", leaf)  # _VersionWrapper(detached tensor)
                if isinstance(leaf, Tensor):
                    yield leaf


def saved_activation_bytes(
    model: nn.Module,
    batch,
    step: TrainingStep,
    forward_seed: int | None,
    module_paths: list[str],
) -> SavedActivations:
    """Bytes of the tensors autograd keeps for backward after the step's forward and loss.

    Runs one forward and the loss on clones of ``batch`` (no backward; the graph is dropped
    on return). Works on real tensors of any device and on ``FakeTensorMode`` tensors
    (call it inside the same fake mode that built ``model`` and ``batch``). A step whose forwards are the
    task's own (``not step.sees_outputs``, :mod:`reportgen.twins.step`) runs whole instead, and what every forward of
    its step saves is counted, summed (two accumulated micro-batches: both); tensors saved while backward
    recomputes a region are not activations kept from the forward and are not counted.

    Args:
        model: a plain or recompute twin, in the mode to measure (``train()`` for training).
        batch: ``(inputs, targets)``, e.g. inputs ``[batch, seq]`` ids or ``[batch, features]``.
        step: the run's training step (:class:`reportgen.twins.step.TrainingStep`): its forward and loss (what
            the loss saves counts: it is kept for backward), or the task's own ``forward_backward``.
        forward_seed: seeds every generator (:func:`reportgen.rng.seeded`) for the forward
            (None = leave them alone).
        module_paths: module paths to attribute bytes to, as in the plain model (``blocks.0``);
            usually the wrapped modules' paths. Each storage goes to the innermost listed
            module running when it was saved (a recompute region's inputs: to that region),
            else to :data:`REST` (:class:`SavedActivations` says how ``produced_by`` is counted).

    Returns:
        :class:`SavedActivations` with total and per-module bytes (B) and storage counts.
    """
    paths = set(module_paths)
    ledger = _Ledger(_weight_keys(model))
    stack: list[str] = []
    owner = lambda: stack[-1] if stack else REST
    handles: list[Any] = []
    contexts: list[Any] = []
    restore: list[Any] = []

    produced: dict[tuple, str] = {}  # storage key of a listed module's output -> its path
    produced_refs: list[Any] = []  # outputs held until the count is done: no address reuse

    def pop(module, args, output):
        name = stack.pop()
        for leaf in tree_leaves(output):
            if isinstance(leaf, Tensor):
                key, _, ref = _identify(leaf)
                if key not in produced:
                    produced[key] = name
                    produced_refs.append(ref)

    def record_inputs(name: str):
        def hook(module, args, kwargs):
            for leaf in tree_leaves((args, kwargs)):
                ledger.add(leaf, name if name in paths else owner())

        return hook

    for raw_name, module in model.named_modules():
        name = plain_name(raw_name)
        if isinstance(module, CheckpointWrapper):
            handles.append(module.register_forward_pre_hook(record_inputs(name), with_kwargs=True))
            fn = module.checkpoint_fn
            if isinstance(fn, functools.partial) and fn.keywords.get("context_fn") is not None:
                restore.append((module, fn))
                module.checkpoint_fn = functools.partial(
                    fn.func,
                    *fn.args,
                    **{**fn.keywords, "context_fn": _tracking_context_fn(fn.keywords["context_fn"], contexts, owner)},
                )
        if name in paths:
            handles.append(module.register_forward_pre_hook(lambda module, args, name=name: stack.append(name)))
            handles.append(module.register_forward_hook(pop, always_call=True))

    # A forward that no backward follows packs a detached alias: a hook that returns a tensor an op saved as its own
    # output makes a cycle (tensor -> grad_fn -> saved variable -> tensor) through C++ that the collector cannot see,
    # so every counted graph (and with it each recompute region's frame and module) would stay alive: on the 113M
    # config 5 GiB after the larger-batch search. A task's own step runs its backward, which frees the graph: its
    # tensors are packed as they are (a second-order step needs their history).
    keep = (lambda t: t) if not step.sees_outputs else (lambda t: t.detach())

    def pack(t: Tensor) -> Tensor:
        if torch._C._current_graph_task_id() == -1:  # not inside a backward (the user's step runs one)
            ledger.add(t, owner())
        return keep(t)

    x, y = clone_inputs(batch[0]), batch[1]
    try:
        with seeded(forward_seed), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = step.forwards(model, (x, y))
        for name, storage in contexts:
            for t in _selective_saved(storage):
                ledger.add(t, name)
    finally:
        for handle in handles:
            handle.remove()
        for module, fn in restore:
            module.checkpoint_fn = fn
    del loss
    per_module = {p: 0 for p in module_paths} | {REST: 0}
    counts = dict.fromkeys(per_module, 0)
    produced_by = dict.fromkeys(module_paths, 0)
    for key, (name, nbytes) in ledger.seen.items():
        per_module[name] += nbytes
        counts[name] += 1
        if name == REST and key in produced:
            produced_by[produced[key]] += nbytes
    return SavedActivations(sum(per_module.values()), per_module, len(ledger.seen), counts, produced_by)


def cuda_step_peaks(setup: Setup, recompute: bool, warm_steps: int, batch: Batch | None = None) -> dict[str, int]:
    """Allocator peaks of one warm training step of a fresh twin on CUDA, on ``batch``
    (default: the fixed batch; the larger-batch search passes its probe batch).

    ``warm_steps`` steps first (optimizer state initialised, allocator caches warm, same batch
    shape), then ``torch.cuda.reset_peak_memory_stats`` immediately before the measured step,
    and ``torch.cuda.synchronize`` before each read (torch.cuda memory-statistics docs).

    Returns:
        ``{"peak_allocated_bytes", "peak_reserved_bytes", "baseline_allocated_bytes"}``, B;
        the baseline is what is allocated right before the step (weights, optimizer state).

    Raises:
        RuntimeError: the setup's device is not CUDA.
        torch.cuda.OutOfMemoryError: the step does not fit; the next call frees what it left.
    """
    device = setup.device
    if device.type != "cuda":
        raise RuntimeError(f"CUDA peaks need a CUDA device, this run is on {device}")
    gc.collect()
    torch.cuda.empty_cache()  # the previous twin's (or failed probe's) blocks must not count here
    step = setup.train_step(recompute, batch=batch)
    for _ in range(max(1, warm_steps)):  # at least one: the optimizer state exists before the measured step
        step()
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_allocated(device)
    reset_peaks(device)
    step()
    torch.cuda.synchronize(device)
    peaks = {
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(device),
        "baseline_allocated_bytes": baseline,
    }
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return peaks
