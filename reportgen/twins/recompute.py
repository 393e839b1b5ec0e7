"""Apply activation recomputation to target submodules with torch's own wrapper.

Follows torchtitan's ``activation_checkpoint.py``: find the target blocks, wrap each with
``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper`` (which
calls ``torch.utils.checkpoint.checkpoint``), and return exactly which modules were wrapped.
Zero matches is an error, never a silent no-op.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import torch
from hydra.utils import get_method
from omegaconf import OmegaConf
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    _CHECKPOINT_PREFIX,
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from reportgen.config import RecomputeConfig, RecomputeMethod, RecomputeMode
from reportgen.errors import UsageError


class RecomputeConfigError(UsageError, ValueError):
    """The recompute settings cannot be applied to this model (a usage error, exit 2)."""


class RecomputeHazard(RuntimeError):
    """The recompute twin is in a state whose backward would never end: raised before backward.

    Seen so far: a reentrant region returned a tensor it did not create (a parameter), which
    ``torch.utils.checkpoint`` then gives a checkpoint ``grad_fn``; its backward recomputes the
    region, which returns the same tensor with the same ``grad_fn``, and recurses until memory runs
    out (torch 2.13, measured: one process reached 6 GB). The message names the tensor.
    """


#: Words every :class:`RecomputeHazard` message about a returned leaf carries (the diagnosis matches them).
RETURNED_LEAF = "a tensor it did not create"


@dataclass(frozen=True)
class Wrapped:
    """One wrapped module: its path in the model (``blocks.0``) and class name."""

    path: str
    cls: str


def matches(path: str, module: nn.Module, pattern: str) -> bool:
    """True when ``pattern`` names the module's class or one of its base classes, or
    glob-matches its path.

    ``Block`` matches every ``Block`` instance and every instance of a subclass of a class
    named ``Block`` (along the MRO, by name, like ``isinstance``); ``blocks.*`` or
    ``layers.[0-3]`` match paths with :func:`fnmatch.fnmatchcase`; a plain path such as
    ``head`` matches that path.
    """
    return any(cls.__name__ == pattern for cls in type(module).__mro__) or fnmatchcase(path, pattern)


def find_targets(model: nn.Module, targets: list[str]) -> list[Wrapped]:
    """Modules of ``model`` that a target matches, outermost only (a match inside a match
    is already recomputed by its ancestor).

    Raises:
        RecomputeConfigError: no targets given, the root matched, or a target matched
            nothing; the message names that target and lists the module classes present so
            the user can fix ``recompute.targets``.
    """
    if not targets:
        raise RecomputeConfigError("recompute.targets is empty: name module classes or path globs to recompute")
    found: list[Wrapped] = []
    for path, module in model.named_modules():
        if not any(matches(path, module, t) for t in targets):
            continue
        if path == "":
            raise RecomputeConfigError("a recompute target matched the whole model; target its submodules instead")
        if any(path.startswith(w.path + ".") for w in found):
            continue
        found.append(Wrapped(path, type(module).__name__))
    unmatched = [t for t in targets if not any(matches(p, m, t) for p, m in model.named_modules() if p)]
    if unmatched:
        classes = sorted({type(m).__name__ for _, m in model.named_modules()})
        raise RecomputeConfigError(
            f"recompute.targets: {', '.join(map(repr, unmatched))} matched no module. Classes in this model: "
            f"{', '.join(classes)}. Set recompute.targets to class names (base classes match too) or module-path "
            "globs (e.g. 'blocks.*')."
        )
    return found


def resolve_ops(names: list[str]) -> list[torch._ops.OpOverload]:
    """Resolve op names to concrete overloads for a selective policy.

    ``aten.mm`` is an op *packet*; the policy is called with overloads (``aten.mm.default``),
    so a packet would silently match nothing. Packets are expanded to all their overloads.

    Raises:
        RecomputeConfigError: a name does not resolve to an op.
    """
    ops: list[Any] = []
    for name in names:
        namespace, _, rest = name.partition(".")
        target = getattr(torch.ops, namespace, None)
        for part in rest.split("."):
            target = getattr(target, part, None) if target is not None and part else None
        if isinstance(target, torch._ops.OpOverloadPacket):
            ops.extend(getattr(target, o) for o in target.overloads())
        elif isinstance(target, torch._ops.OpOverload):
            ops.append(target)
        else:
            raise RecomputeConfigError(
                f"recompute.save_ops: {name!r} is not an op; write e.g. 'aten.mm' or 'aten.mm.default'"
            )
    return ops


def _periodic_policy(ops: frozenset, periods: dict) -> Callable:
    """A fresh policy for one region's call: ops of ``periods`` (``{overload: n}``) are saved only on
    their 1st, (n+1)-th ... call, counted separately in the forward and in the recompute (as
    torchtitan's selective op policy counts ``aten.mm``); other listed ops are always saved."""
    counts: dict[tuple[bool, Any], int] = {}

    def policy(ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func not in ops:
            return CheckpointPolicy.PREFER_RECOMPUTE
        period = periods.get(func)
        if period is None:
            return CheckpointPolicy.MUST_SAVE
        key = (ctx.is_recompute, func)
        counts[key] = counts.get(key, 0) + 1
        return CheckpointPolicy.MUST_SAVE if counts[key] % period == 1 % period else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _periodic_context(ops: frozenset, periods: dict):
    """``context_fn`` of a selective region: a new policy per call (its period counts start afresh)."""
    return create_selective_checkpoint_contexts(_periodic_policy(ops, periods))


def resolve_periods(periods: dict[str, int], save_ops: list[str]) -> dict:
    """``recompute.save_period`` as ``{overload: n}``.

    Raises:
        RecomputeConfigError: an entry not in ``save_ops``, or a period that is not a whole number >= 1.
    """
    resolved = {}
    for name, n in periods.items():
        if name not in save_ops:
            raise RecomputeConfigError(
                f"recompute.save_period: {name!r} is not in recompute.save_ops; list it there too"
            )
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise RecomputeConfigError(
                f"recompute.save_period.{name}={n!r} must be a whole number >= 1 (2: every second call is recomputed)"
            )
        resolved.update({op: n for op in resolve_ops([name])})
    return resolved


def checkpoint_kwargs(rc: RecomputeConfig) -> tuple[CheckpointImpl, dict]:
    """Translate ``cfg.recompute`` into checkpoint_wrapper's implementation and kwargs (a null
    ``recompute.mode`` is refused before, by :func:`reportgen.commands.validation.config_problems`)."""
    kwargs = {"preserve_rng_state": bool(rc.preserve_rng_state), "determinism_check": str(rc.determinism_check)}
    if rc.mode is RecomputeMode.reentrant:
        return CheckpointImpl.REENTRANT, {"preserve_rng_state": kwargs["preserve_rng_state"]}
    if rc.mode is RecomputeMode.selective:
        if not rc.save_ops:
            raise RecomputeConfigError("recompute.mode=selective needs recompute.save_ops, e.g. ['aten.mm']")
        ops = frozenset(resolve_ops(list(rc.save_ops)))
        periods = resolve_periods(rc.save_period, list(rc.save_ops))
        kwargs["context_fn"] = functools.partial(_periodic_context, ops, periods)
    elif rc.save_ops or rc.save_period:
        raise RecomputeConfigError("recompute.save_ops and save_period are only used with recompute=selective")
    return CheckpointImpl.NO_REENTRANT, kwargs


def apply_recompute(model: nn.Module, rc: RecomputeConfig) -> list[Wrapped]:
    """Wrap each target submodule of ``model`` in place; return what was wrapped.

    Args:
        model: the recompute twin (modified in place).
        rc: ``cfg.recompute`` (mode, targets, preserve_rng_state, determinism_check, save_ops).

    With ``recompute.method=model_switch`` the model's own switch is called instead
    (``recompute.enable``, e.g. :func:`reportgen.models.hf.enable`) and nothing is wrapped: the
    modules that recompute are found by observing the twin
    (:func:`reportgen.twins.observe.observe_recompute`).

    Raises:
        RecomputeConfigError: see :func:`find_targets` and :func:`resolve_ops`; a switch
            without ``recompute.enable``, or one that cannot be imported.
    """
    if is_model_switch(rc):
        switch_on(model, rc)
        return []
    impl, kwargs = checkpoint_kwargs(rc)
    wrapped = find_targets(model, list(rc.targets))
    for w in wrapped:
        parent_path, _, name = w.path.rpartition(".")
        parent = model.get_submodule(parent_path)
        region = parent.get_submodule(name)
        if impl is CheckpointImpl.REENTRANT:
            region.register_forward_hook(functools.partial(_created_outside, w.path), with_kwargs=True)
        setattr(parent, name, checkpoint_wrapper(region, checkpoint_impl=impl, **kwargs))
    return wrapped


def _created_outside(path: str, module: nn.Module, args, kwargs, output) -> None:
    """Forward hook of a reentrant region's module: raise :class:`RecomputeHazard` when the region
    returns a tensor it did not create.

    Reentrant ``torch.utils.checkpoint`` runs the region's first forward under ``no_grad``, so every
    tensor the region creates there has ``requires_grad=False``; an output that requires grad and is
    not one of its inputs existed before (a parameter, a graph tensor kept on an object), and would
    get the checkpoint's ``grad_fn``. In the recomputation (grad enabled) and in plain calls under
    grad the hook says nothing. A region that turns grad on itself (``torch.enable_grad()``) is not judged.
    """
    if torch.is_grad_enabled():
        return
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    for leaf in tree_leaves(output):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad and not any(leaf is a for a in inputs):
            name = next((n for n, p in module.named_parameters() if p is leaf), None)
            what = f"its parameter {path}.{name}" if name else f"a tensor {list(leaf.shape)} that requires grad"
            raise RecomputeHazard(
                f"reentrant recompute region {path} returned {RETURNED_LEAF} ({what}, which existed before the "
                "region ran): reentrant recompute gives it the region's grad_fn, so backward would recompute the "
                "region again and again until memory runs out; backward was not run"
            )


def guard_returned_leaves(model: nn.Module) -> None:
    """After every forward of ``model``, raise :class:`RecomputeHazard` when a parameter or buffer
    has a ``grad_fn`` (it is no longer a leaf), before any backward can recurse on it.

    A parameter or buffer gets a ``grad_fn`` only when a custom autograd Function returned it as
    an output: reentrant ``torch.utils.checkpoint`` (``CheckpointFunction``) does so for a region
    that returns a tensor it did not create. Installed on the recompute twin only by
    :meth:`reportgen.twins.setup.Setup.build`, whatever the method (wrapper or the model's own switch).
    Tensors kept elsewhere (a global, another object) are not watched, nor the computed tensors
    ``torch.func.functional_call`` puts in a parameter's place for one forward (weight noise, MAML): only an
    ``nn.Parameter`` itself, or a registered buffer, that became a non-leaf is the hazard.
    """

    def check(module: nn.Module, args, output) -> None:
        if torch.compiler.is_compiling():  # a compiled twin: not traced into its graph
            return
        for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
            for name, t in named:
                if kind == "parameter" and not isinstance(t, nn.Parameter):  # swapped in by functional_call
                    continue
                # a view is not a returned leaf: FSDP1 (use_orig_params) makes each parameter a view of
                # its unit's gathered flat parameter during forward (grad_fn ViewBackward0)
                if t.grad_fn is not None and not t._is_view():
                    raise RecomputeHazard(
                        f"after the forward, {kind} {plain_name(name)} has grad_fn {type(t.grad_fn).__name__}: a "
                        f"recompute region returned {RETURNED_LEAF} (its own {kind}), and a reentrant region's "
                        "output gets the region's grad_fn, so backward would recompute the region again and again "
                        "until memory runs out; backward was not run"
                    )

    model.register_forward_hook(check)


def is_model_switch(rc: RecomputeConfig) -> bool:
    """True for ``recompute.method=model_switch`` (the model's own switch turns recompute on)."""
    return rc.method is RecomputeMethod.model_switch


def switch_on(model: nn.Module, rc: RecomputeConfig) -> bool | None:
    """Call ``recompute.enable(model, recompute_cfg)``, the model's own switch (``method=model_switch``);
    ``recompute_cfg`` is ``rc`` as a structured DictConfig, what a switch has always been given.

    Returns:
        What the switch returns: by contract the ``use_reentrant`` value in force (True/False),
        or None when the switch does not say (e.g. a user's switch that returns nothing).

    Raises:
        RecomputeConfigError: ``recompute.enable`` is not set or cannot be imported.
    """
    if not rc.enable:
        raise RecomputeConfigError(
            "recompute.method=model_switch needs recompute.enable: the dotted path of "
            "fn(model, recompute_cfg), e.g. reportgen.models.hf.enable"
        )
    try:
        enable = get_method(rc.enable)
    except Exception as exc:  # an import error of user code, as a usage error
        raise RecomputeConfigError(f"recompute.enable={rc.enable} cannot be imported: {exc}") from exc
    reported = enable(model, OmegaConf.structured(rc))
    return reported if isinstance(reported, bool) else None


def effective_mode(rc: RecomputeConfig, reported: bool | None) -> tuple[RecomputeMode | None, str | None]:
    """The recompute mode in force and, when the model chose it, a note saying so: worked out once per
    run, by :func:`reportgen.twins.setup.build_setup` (``Setup.mode``, ``Setup.mode_note``).

    Args:
        rc: ``cfg.recompute``.
        reported: what :func:`switch_on` returned (the ``use_reentrant`` the switch used), or None.

    Returns:
        ``(mode, note)``: ``mode`` is a :class:`reportgen.config.RecomputeMode` or None
        (not set and the switch did not say); ``note`` is None when ``recompute.mode`` was set, else
        e.g. ``"the model's own default (use_reentrant=True)"``.
    """
    if rc.mode is not None:
        return rc.mode, None
    if reported is None:
        return None, "the model's own default (the switch did not say which)"
    chosen = RecomputeMode.reentrant if reported else RecomputeMode.non_reentrant
    return chosen, f"the model's own default (use_reentrant={reported})"


def plain_name(name: str) -> str:
    """A recompute-twin parameter/module name with the wrapper's segment removed, so it
    equals the plain twin's name (``blocks.0._checkpoint_wrapped_module.lin`` → ``blocks.0.lin``)."""
    return name.replace(_CHECKPOINT_PREFIX, "").replace("." + _CHECKPOINT_PREFIX.rstrip("."), "")


def named_inner_modules(model: nn.Module):
    """``(plain_name, module)`` for every module except the wrappers themselves."""
    for name, module in model.named_modules():
        if not isinstance(module, CheckpointWrapper):
            yield plain_name(name), module
