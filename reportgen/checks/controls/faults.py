"""The faults the detector controls inject: hooks on the modules of one recompute region that act only
while the region recomputes, so each fault travels through the twin's own backward like a real
recompute bug.

"While it recomputes" is observed the way :mod:`reportgen.twins.observe` observes recomputation, for
any implementation (torch's wrappers, selective policies, a model's own switch): a module's forward
runs while autograd's engine is running a backward (``torch._C._current_graph_task_id() != -1``).
The forward itself is never touched, so the loss and outputs stay the plain twin's.

Why the inputs and not the outputs: non-reentrant recompute (torch's default) replays the region only
to get back the tensors its ops *saved* for backward; what the region returns in that replay is never
read. A fault has to change what the ops compute, so it changes what they compute *from*.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from reportgen.rng import capture, restore, seed_all


def recomputing() -> bool:
    """True while autograd's engine runs a backward: a module forward that starts now is a recomputation."""
    return torch._C._current_graph_task_id() != -1


@dataclass
class Switch:
    """Whether a fault acts (the trajectory control turns it on from step k), and how often it did.

    Attributes:
        on: the fault acts while the region recomputes.
        acted: how many times it moved an activation (a region skipped in a step, e.g. by LayerDrop, is
            never recomputed there, so the fault cannot act in that step).
    """

    on: bool = True
    acted: int = 0


def floating(value: Any) -> bool:
    """True for a floating-point tensor (what a fault may move; ids, masks and counters stay)."""
    return isinstance(value, Tensor) and value.is_floating_point()


def any_floating(args: Any, kwargs: Any) -> bool:
    """True when the call's positional or keyword arguments hold a floating tensor at any depth."""
    found = []
    tree_map(lambda v: found.append(floating(v)), (args, kwargs))
    return any(found)


def _signs(shape: torch.Size, seed: int, like: Tensor) -> Tensor:
    """``±1`` of ``shape`` from a private generator seeded with ``seed`` (the run's generators are not
    touched: a draw from them would be a second, unintended fault), as ``like``'s dtype and device."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 2, shape, generator=generator) * 2 - 1).to(device=like.device, dtype=like.dtype)


def shift(x: Tensor, share: float, seed: int) -> Tensor:
    """``x`` moved elementwise by ``share`` of its own size, signs seeded:
    ``x + share * s * (|x| + rms(x))``, ``s`` = ±1 (seeded, as the rounding twin's nudge is). The signs
    keep a shift from being undone by a normalisation (a LayerNorm removes a common shift or scale);
    ``rms(x)`` (1 for an all-zero ``x``) moves elements that are exactly 0 (after a ReLU) too.

    Args:
        x: a floating tensor of any shape, e.g. ``[batch, seq, width]``.
        share: relative size of the move (0.01 = 1 % of each element's magnitude plus 1 % of the rms).
        seed: seeds the signs.

    Returns:
        A new tensor (``x`` is never changed in place); gradients flow through it to ``x``.
    """
    with torch.no_grad():
        rms = x.detach().float().square().mean().sqrt().item() if x.numel() else 0.0
        delta = share * _signs(x.shape, seed, x) * (x.detach().abs() + (rms or 1.0))
    return x + delta


def _map_activation(fn: Callable[[Tensor], Tensor], switch: Switch) -> Callable:
    """A forward pre-hook (``with_kwargs=True``) that replaces the module's activation ``x`` by ``fn(x)``,
    only while recomputing with ``switch.on`` (counted in ``switch.acted``); the forward is never touched.

    The activation is the first floating tensor among the positional, then the keyword arguments
    (``hidden_states``); later ones (an additive attention mask holding the dtype's minimum, rotary tables)
    are left alone: moving a mask is not a recompute fault, and overflows. ``fn`` runs outside torch's
    dispatch modes (:func:`uninstrumented`)."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not (switch.on and recomputing()):
            return None
        leaves, spec = tree_flatten((args, kwargs))
        first = next((i for i, v in enumerate(leaves) if floating(v)), None)
        if first is None:
            return None
        switch.acted += 1
        with uninstrumented():
            leaves[first] = fn(leaves[first])
        return tree_unflatten(leaves, spec)

    return hook


def uninstrumented():
    """A context in which the fault's own ops run outside torch's Python dispatch modes: a selective
    policy replays a region's ops by their order (an op the forward did not run would be an error, not a
    fault) and a memory tracker would count them. Autograd still records them, so gradients flow through."""
    return _disable_current_modes()


@contextlib.contextmanager
def hooked(modules: Sequence[nn.Module], pre: Callable | None = None, post: Callable | None = None) -> Iterator[None]:
    """Install ``pre`` (a forward pre-hook, ``with_kwargs=True``) and ``post`` (a forward hook, always
    called) on each of ``modules`` for the body; remove them after, also when the body raises."""
    handles = []
    try:
        for module in modules:
            if pre is not None:
                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            if post is not None:
                handles.append(module.register_forward_hook(post, always_call=True))
        yield
    finally:
        for handle in handles:
            handle.remove()


def shifted_inputs(modules: Sequence[nn.Module], share: float, seed: int, switch: Switch | None = None):
    """Fault "recomputed activation off": while recomputing (and ``switch.on``), each of ``modules``
    computes from its activation (first floating input) moved by ``share`` of its size (:func:`shift`).

    Args:
        modules: the region's modules that run again in backward (a wrapped block; a layer's children
            when a switch recomputes the layer's ``forward`` only).
        share: relative size of the move (dimensionless; 1.0 = 100 %).
        seed: seeds the signs of the move.
        switch: turns the fault on and off between steps and counts when it acted; None = always on.

    Returns:
        A context manager that installs the hooks and removes them on exit.
    """
    return hooked(modules, pre=_map_activation(lambda x: shift(x, share, seed), switch or Switch()))


def zeroed_inputs(modules: Sequence[nn.Module]):
    """Fault "gradient lost": while recomputing, each of ``modules`` computes from its activation (first
    floating input) times zero. Under non-reentrant recompute the
    saved tensors are rebuilt from zeros, so every gradient that reads them (the first layer's weight
    gradient) is lost; under reentrant recompute the recomputed graph is the one backward walks, so the same
    gradients are lost and the gradient into the region's inputs is zero too. ``x * 0`` keeps ``x``'s
    ``requires_grad``: zeros without it (``zeros_like``) make ops skip saving tensors, and torch's checkpoint
    then raises on the count instead of losing a gradient silently. A context manager, as
    :func:`shifted_inputs`."""
    return hooked(modules, pre=_map_activation(lambda x: x * 0.0, Switch()))


def other_rng(modules: Sequence[nn.Module], seed: int):
    """Fault "RNG not replayed": while recomputing, each of ``modules`` draws from every generator
    (torch CPU and CUDA, Python ``random``, NumPy) seeded with ``seed`` instead of the state its forward
    drew from; the states are put back when it returns, so nothing after it is disturbed. A context
    manager, as :func:`shifted_inputs`."""
    saved: list[dict[str, Any]] = []

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if recomputing():
            with uninstrumented():
                saved.append(capture())
                seed_all(seed)

    def post(module: nn.Module, args: tuple, output: Any) -> None:
        if recomputing() and saved:
            with uninstrumented():
                restore(saved.pop())

    return hooked(modules, pre=pre, post=post)


def bumped_buffer(modules: Sequence[nn.Module], buffer: Tensor):
    """Fault "state changed by recomputation": the first time one of ``modules`` starts a recomputation,
    ``buffer`` grows by 1 (a running statistic or counter updated a second time). Through ``.data``, so
    autograd's version check does not stop a backward that saved the buffer; at the start, since a
    non-reentrant recomputation stops once every saved tensor is back. A context manager, as
    :func:`shifted_inputs`."""
    done: list[bool] = []

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if recomputing() and not done:
            done.append(True)
            with uninstrumented(), torch.no_grad():
                buffer.data.add_(1)

    return hooked(modules, pre=pre)


def call_directly(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """A ``checkpoint_fn`` that calls the wrapped module as it is: a recompute wrapper that saves
    everything, as the plain twin does (the memory control)."""
    return fn(*args, **kwargs)
