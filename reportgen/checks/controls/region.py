"""The recompute region the detector controls inject into, and what is observed of it in one
forward and backward of an unfaulted recompute twin: which of its modules run again in backward (where
a fault can act), whether it draws random numbers, which buffer it holds.

Regions are ``setup.observed``: paths, in the plain twin's naming, of the modules seen recomputing
(:func:`reportgen.twins.observe.observe_recompute`), whatever turned recomputation on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from reportgen.checks.controls.faults import any_floating, hooked, recomputing, uninstrumented
from reportgen.rng import fingerprint
from reportgen.twins.recompute import named_inner_modules, plain_name


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
        observed: ``setup.observed``, non-empty.
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
        floating_inputs: some hook point received a floating tensor when it ran again (a fault on the
            inputs can act; token ids alone cannot be moved).
        draws: the generators whose state the region's forward advanced (``torch.get_rng_state()``, ...;
            :func:`reportgen.rng.fingerprint`'s names): empty when it draws no random numbers.
        buffer: the buffer the state fault updates (plain naming): the region's first floating buffer,
            else its first integer one; None when it has none (bool masks are never changed).
    """

    path: str
    hook_points: list[str] = field(default_factory=list)
    floating_inputs: bool = False
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
    floating = [n for n, b in buffers if b.is_floating_point()]
    integer = [n for n, b in buffers if not b.is_floating_point() and not b.is_complex() and b.dtype != torch.bool]
    return next(iter(floating or integer), None)


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
    again: dict[str, bool] = {}
    before: list[dict[str, Tensor]] = []

    def recorder(name: str):
        def pre(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if recomputing():
                again[name] = again.get(name, False) or any_floating(args, kwargs)

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
    region.floating_inputs = any(again[p] for p in outermost)
