"""The faults the detector controls inject (docs/verdict.md, "the detector controls"), and what is observed of
the region they go into: hooks on the region's modules that act only while it recomputes, i.e. while a module's
forward runs inside autograd's backward, whatever turned recomputation on. The forward itself is never touched.

Faults move the inputs, not the outputs: non-reentrant recompute replays the region only to get back the tensors
its ops saved for backward and never reads what it returns, so a fault changes what the ops compute *from*. Each
is a recompute bug that happens: another example's input read (a stale or reordered buffer), a random stream not
replayed, state updated again, a gradient lost; none is sized by the tolerance it must be caught at.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from reportgen.rng import capture, fingerprint, restore, seed_all
from reportgen.twins.recompute import named_inner_modules, plain_name


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


def roll_dim(x: Tensor) -> int | None:
    """The dimension a stale input is rolled along: the first one with more than one entry (the batch, else the
    sequence or feature axis); None when every dimension has one entry (nothing else to read)."""
    return next((d for d, n in enumerate(x.shape) if n > 1), None)


def rollable(value: Any) -> bool:
    """True for a tensor with more than one entry along some dimension (what a stale-input fault can roll)."""
    return isinstance(value, Tensor) and roll_dim(value) is not None


def _map_input(fn: Callable[[Tensor], Tensor], switch: Switch, wanted: Callable[[Any], bool]) -> Callable:
    """A forward pre-hook (``with_kwargs=True``) that replaces the module's first argument ``wanted`` accepts (among
    the positional, then the keyword arguments) by ``fn(x)`` (:func:`uninstrumented`), only while recomputing with
    ``switch.on`` (counted in ``switch.acted``). Later arguments (an additive attention mask holding the dtype's
    minimum, rotary tables) are left alone."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if not (switch.on and recomputing()):
            return None
        leaves, spec = tree_flatten((args, kwargs))
        first = next((i for i, v in enumerate(leaves) if wanted(v)), None)
        if first is None:
            return None
        switch.acted += 1
        with uninstrumented():
            leaves[first] = fn(leaves[first])
        return tree_unflatten(leaves, spec)

    return hook


def stale_inputs(modules: Sequence[nn.Module], switch: Switch | None = None):
    """Fault "stale input": while recomputing (and ``switch.on``), each of ``modules`` computes from another
    example's input, its first tensor argument rolled by one along its first dimension of more than one entry
    (:func:`roll_dim`: the batch), whatever its kind (activations, token ids). Gradients flow through the roll.

    Args:
        modules: the region's modules that run again in backward.
        switch: turns the fault on and off between steps and counts when it acted; None = always on.

    Returns:
        A context manager that installs the hooks and removes them on exit.
    """
    roll = lambda x: torch.roll(x, 1, dims=roll_dim(x))
    return hooked(modules, pre=_map_input(roll, switch or Switch(), rollable))


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


def zeroed_inputs(modules: Sequence[nn.Module]):
    """Fault "gradient lost": while recomputing, each of ``modules`` computes from its activation (first floating
    argument) times zero,
    so every gradient that reads the rebuilt saved tensors is lost (under reentrant recompute the gradient
    into the region's inputs too). ``x * 0`` keeps ``requires_grad``: zeros without it make ops skip saving
    tensors, and torch's checkpoint raises on the count instead. A context manager, as :func:`stale_inputs`."""
    return hooked(modules, pre=_map_input(lambda x: x * 0.0, Switch(), floating))


def scaled_inputs(modules: Sequence[nn.Module], relative_error: float):
    """The detection limit's probe: while recomputing, each of ``modules`` computes from its activation (first
    floating argument) times ``1 + relative_error``, a recomputed activation off by that relative error (a recompute
    at lower precision is off by up to its unit roundoff, 2^-8 in bf16). A context manager, as :func:`stale_inputs`."""
    return hooked(modules, pre=_map_input(lambda x: x * (1.0 + relative_error), Switch(), floating))


def other_rng(modules: Sequence[nn.Module], seed: int):
    """Fault "RNG not replayed": while recomputing, each of ``modules`` draws from every generator
    (torch CPU and CUDA, Python ``random``, NumPy) seeded with ``seed`` instead of the state its forward
    drew from; the states are put back when it returns, so nothing after it is disturbed. A context
    manager, as :func:`stale_inputs`."""
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
    ``buffer`` grows by 1 (a running statistic updated a second time). Through ``.data``, so autograd's
    version check does not stop a backward that saved it; at the start, since a non-reentrant recomputation
    stops once every saved tensor is back. A context manager, as :func:`stale_inputs`."""
    done: list[bool] = []

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if recomputing() and not done:
            done.append(True)
            with uninstrumented(), torch.no_grad():
                buffer.data.add_(1)

    return hooked(modules, pre=pre)


#: The attribute the state fault sets on a region without buffers: a Python counter its forward would keep
#: (``self.calls += 1``), updated once more by the recomputation (the forward-counter case).
COUNTER = "recompute_fault_calls"


def bumped_counter(modules: Sequence[nn.Module]):
    """Fault "state changed by recomputation" for a region without buffers: the first time one of ``modules``
    starts a recomputation, a counter attribute (:data:`COUNTER`) on the first of them grows by 1, as a forward
    that counts its calls in a Python attribute does when it runs again. A context manager, as
    :func:`stale_inputs`; the attribute stays on the (throwaway) faulty twin."""
    done: list[bool] = []

    def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if recomputing() and not done:
            done.append(True)
            setattr(modules[0], COUNTER, getattr(modules[0], COUNTER, 0) + 1)

    return hooked(modules, pre=pre)


def call_directly(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """A ``checkpoint_fn`` that calls the wrapped module as it is: a recompute wrapper that saves
    everything, as the plain twin does (the memory control)."""
    return fn(*args, **kwargs)


# --------------------------------------------------------------------------- the region


def inside(name: str, region: str) -> bool:
    """True when the parameter, buffer or module ``name`` (plain naming) lies in ``region`` (``""`` = the root)."""
    return region == "" or name == region or name.startswith(region + ".")


def largest_grad(grads: dict[str, Tensor | None], region: str | None = None) -> float:
    """``max |grad|`` over the gradients of the parameters in ``region`` (every parameter when None); 0
    when none has a gradient. Same unit as the gradients."""
    values = [
        float(g.detach().abs().max()) if g.numel() else 0.0
        for name, g in grads.items()
        if g is not None and (region is None or inside(name, region))
    ]
    return max(values, default=0.0)


def choose_region(observed: list[str], grads: dict[str, Tensor | None]) -> str:
    """The observed region whose parameters get the largest gradient in the plain twin (the first observed
    one on a tie, e.g. when none has parameters): where a fault moves the gradients most, so a control
    that is not caught there is not caught anywhere.

    Args:
        observed: ``setup.observed`` (plain naming, :func:`reportgen.twins.observe.observe_recompute`).
        grads: the plain twin's ``{plain parameter name: gradient or None}``.

    Raises:
        ValueError: ``observed`` is empty.
    """
    if not observed:
        raise ValueError("no recompute region was observed")
    return max(observed, key=lambda path: (largest_grad(grads, path), -observed.index(path)))


@dataclass
class Region:
    """One recompute region as the controls see it in an unfaulted recompute twin.

    Attributes:
        path: the region's module path, plain naming (``blocks.3``; ``""`` = the root).
        hook_points: paths of the outermost modules of the region that ran again in backward: the region
            itself under torch's wrappers; a layer's children when a model's switch recomputes the
            layer's ``forward`` and not its ``__call__`` (transformers 5).
        floating_inputs: some hook point received a floating tensor when it ran again (the lost-gradient fault
            can act; token ids alone carry no gradient).
        rollable_inputs: some hook point received a tensor with more than one entry along some dimension when it
            ran again (the stale-input fault can act, token ids too).
        draws: the generators whose state the region's forward advanced (``torch.get_rng_state()``, ...;
            :func:`reportgen.rng.fingerprint`'s names): empty when it draws no random numbers.
        buffer: the buffer the state fault updates (plain naming): the region's first floating buffer,
            else its first integer one; None when it has none (bool masks are never changed).
    """

    path: str
    hook_points: list[str] = field(default_factory=list)
    floating_inputs: bool = False
    rollable_inputs: bool = False
    draws: list[str] = field(default_factory=list)
    buffer: str | None = None


def modules_of(model: nn.Module, paths: list[str]) -> list[nn.Module]:
    """The modules of ``model`` (a recompute twin) at ``paths`` (plain naming), in that order.

    Raises:
        KeyError: a path names no module of ``model``.
    """
    named = dict(named_inner_modules(model))
    return [named[p] for p in paths]


def buffer_of(model: nn.Module, name: str) -> Tensor:
    """The buffer ``name`` (plain naming) of ``model``.

    Raises:
        KeyError: no such buffer.
    """
    return {plain_name(n): b for n, b in model.named_buffers()}[name]


def _choose_buffer(model: nn.Module, region: str) -> str | None:
    """The first floating buffer in ``region``, else its first integer (not bool) one, else None."""
    buffers = [(plain_name(n), b) for n, b in model.named_buffers() if inside(plain_name(n), region)]
    floats = [n for n, b in buffers if b.is_floating_point()]
    integer = [n for n, b in buffers if not b.is_floating_point() and not b.is_complex() and b.dtype != torch.bool]
    return next(iter(floats or integer), None)


@contextlib.contextmanager
def observing(model: nn.Module, path: str) -> Iterator[Region]:
    """Observe ``path`` of ``model`` (a recompute twin) during the forward and backward the body runs.

    Every module of the region gets a pre-hook: in backward it records that the module ran again (and
    whether it got a floating input); the region's own module compares every generator's state before and
    after its forward (:func:`reportgen.rng.fingerprint`). The hooks are removed on exit, and the
    :class:`Region` yielded is complete then.

    Raises:
        KeyError: ``path`` names no module of ``model``.
    """
    named = [(p, m) for p, m in named_inner_modules(model) if inside(p, path)]
    region_module = dict(named)[path]
    region = Region(path, buffer=_choose_buffer(model, path))
    again: dict[str, tuple[bool, bool]] = {}
    before: list[dict[str, Tensor]] = []

    def recorder(name: str):
        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if recomputing():
                leaves, (was_floating, was_rollable) = tree_leaves((args, kwargs)), again.get(name, (False, False))
                again[name] = (was_floating or any(map(floating, leaves)), was_rollable or any(map(rollable, leaves)))

        return pre

    def rng_before(module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not recomputing():
            with uninstrumented():
                before.append(fingerprint())

    def rng_after(module: nn.Module, args: tuple, output: Any) -> None:
        if not recomputing() and before:
            with uninstrumented():
                start, end = before.pop(), fingerprint()
            region.draws += [k for k in start if k not in region.draws and not torch.equal(start[k], end[k])]

    with contextlib.ExitStack() as stack:
        for name, module in named:
            stack.enter_context(hooked([module], pre=recorder(name)))
        stack.enter_context(hooked([region_module], pre=rng_before, post=rng_after))
        yield region
    outermost = [p for p in again if not any(q != p and inside(p, q) for q in again)]
    region.hook_points = outermost
    region.floating_inputs = any(again[p][0] for p in outermost)
    region.rollable_inputs = any(again[p][1] for p in outermost)
