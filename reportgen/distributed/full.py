"""Whole tensors of a spread twin, named as the plain single-process twin names them.

``DTensor.full_tensor()`` (FSDP2), ``summon_full_params`` and torch's full optimizer state dict
(FSDP1), or the tensors themselves (DDP replicas, whose gradients are all-reduced), as PyTorch's
own FSDP tests compare sharded models with a single-process reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn

from reportgen.twins.recompute import plain_name

#: Segment DDP puts before every parameter name.
DDP_PREFIX = "module."
#: Segment FSDP1 puts before the names inside each of its units.
FSDP1_PREFIX = "_fsdp_wrapped_module."


def dist_name(name: str) -> str:
    """A distributed twin's parameter name as the plain single-process twin spells it (DDP's
    ``module.`` and the recompute wrapper's segment removed)."""
    return plain_name(name.removeprefix(DDP_PREFIX).replace(FSDP1_PREFIX, ""))


def full(t: Tensor) -> Tensor:
    """The whole tensor: ``DTensor.full_tensor()`` (a collective: every rank must call it in the
    same order) or the tensor itself, detached and cloned."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().clone()


def is_fsdp1(model: nn.Module) -> bool:
    """True for a ``FullyShardedDataParallel`` (FSDP1) root."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def full_view(model: nn.Module, with_grads: bool = False):
    """A context in which ``model.named_parameters()`` are whole tensors: FSDP1's
    ``summon_full_params`` (a collective; with the gradients when ``with_grads``), else nothing."""
    if not is_fsdp1(model):
        return contextlib.nullcontext()
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel.summon_full_params(model, writeback=False, with_grads=with_grads)


def full_grads(model: nn.Module) -> dict[str, Tensor | None]:
    """``{plain name: full gradient or None}`` of every trainable parameter (collective under FSDP)."""
    with full_view(model, with_grads=True):
        return {
            dist_name(n): (full(p.grad) if p.grad is not None else None)
            for n, p in model.named_parameters()
            if p.requires_grad
        }


def full_params(model: nn.Module) -> dict[str, Tensor]:
    """``{plain name: full parameter}`` (collective under FSDP)."""
    with full_view(model):
        return {dist_name(n): full(p) for n, p in model.named_parameters()}


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Tensor]:
    """``{"<plain param name>.<state key>": full tensor}`` of the optimizer state (AdamW's
    ``exp_avg``, ``step``, ...), as :func:`reportgen.twins.snapshot.take` names them (collective under FSDP).
    FSDP1 keeps it per flat shard: torch's ``get_optimizer_state_dict(full_state_dict=True)`` gathers it."""
    if is_fsdp1(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))["state"]
        by_name = {dist_name(str(n)): values for n, values in state.items()}
    else:
        names = {p: dist_name(n) for n, p in model.named_parameters()}
        by_name = {names[p]: values for p, values in optimizer.state.items()}
    return {
        f"{name}.{k}": full(v if torch.is_tensor(v) else torch.tensor(v))
        for name, values in by_name.items()
        for k, v in values.items()
    }


def held_grads(model: nn.Module) -> dict[str, Tensor | None]:
    """``{plain name: gradient as this rank holds it, or None}`` of every trainable parameter, no collective and no
    copy: a ``DTensor`` shard under FSDP2 (or a user's wrap), the all-reduced replica under DDP; FSDP1 gathers
    (``summon_full_params(with_grads=True)``, a collective) and only rank 0 keeps the whole gradients. What a sharded
    check keeps of a twin it drops, to compare tensor by tensor later (:func:`each_full`)."""
    if is_fsdp1(model):
        import torch.distributed as dist

        grads = full_grads(model)
        return grads if dist.get_rank() == 0 else dict.fromkeys(grads)
    return {
        dist_name(n): (p.grad.detach() if p.grad is not None else None)
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def each_full(*held: Mapping[str, Tensor | None], keep: bool) -> Iterator[tuple[str, list[Tensor | None]]]:
    """For each name of ``held`` (one mapping per twin, e.g. :func:`held_grads`; the same names on every rank), in
    name order: the whole tensor of each mapping (None where a mapping has none). A ``DTensor`` is gathered
    (``full_tensor()``, a collective: every rank calls this in the same order) one tensor at a time; ranks with
    ``keep`` False get Nones and drop what they gathered at once, so a rank holds at most one whole tensor per
    mapping at a time (the caller drops it before the next)."""
    for name in sorted(set().union(*held)):
        tensors: list[Tensor | None] = []
        for mapping in held:
            t = mapping.get(name)
            whole = t.full_tensor() if t is not None and hasattr(t, "full_tensor") else t
            tensors.append(whole if keep else None)
            del whole
        yield name, tensors
