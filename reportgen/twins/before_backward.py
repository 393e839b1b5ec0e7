"""What the twins show before any backward runs, so the diagnosis names a cause it saw rather than one a symptom
suggests: the recompute regions whose inputs do not require grad (:func:`frozen_regions`), and the module attributes
that already differ between the plain and the recompute twin before backward, when no recomputation has run yet
(:func:`set_before_backward`: a flag the model's own switch sets, or one its forward flips because of it)."""

from __future__ import annotations

from typing import Any

from torch import nn

from reportgen.rng import seeded
from reportgen.structure import clone_inputs, named_tensors
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import module_attributes


def regions(setup: Setup, model: nn.Module) -> list[str]:
    """The recompute regions, as paths of the plain ``model``: the modules reportgen wraps (``recompute.targets``),
    else (the model's own switch) those seen recomputing (:attr:`Setup.observed`), else (a switch under which nothing
    recomputes, as reentrant recompute behind a frozen input does) every module but the root that holds a trainable
    parameter: the regions the switch may have made are among them."""
    if found := [w.path for w in setup.wrapped] or list(setup.observed or []):
        return found
    return [path for path, m in model.named_modules() if path and any(p.requires_grad for p in m.parameters())]


def frozen_regions(setup: Setup) -> list[str]:
    """The recompute regions none of whose floating tensor inputs requires grad, seen on a fresh plain twin at the
    fixed batch: a forward pre-hook on each region reads the tensors it is called with (positional and keyword), in
    one forward of the step (no backward; the task's own ``forward_backward`` runs whole).

    This is the premise of the reentrant implementation's lost gradients: ``torch.utils.checkpoint(use_reentrant=True)``
    gives a region's output a ``grad_fn`` only when one of its tensor inputs requires grad, so the region's own
    parameters get no gradient otherwise (torch.utils.checkpoint docs). A region that only reads its parameters, or
    whose first call takes no floating tensor, is frozen by the same rule.

    Returns:
        Region paths (:func:`regions`) in the order their first call ran, outermost only (a region inside a listed
        one is not listed); a region that never ran is not listed.
    """
    model = setup.build(recompute=False, compiled=False)
    seen: dict[str, bool] = {}

    def record(path: str, module: nn.Module, args: Any, kwargs: Any) -> None:
        tensors = [t for _, t in named_tensors((args, kwargs), "") if t.is_floating_point() or t.is_complex()]
        seen.setdefault(path, any(t.requires_grad for t in tensors))

    handles = [
        model.get_submodule(path).register_forward_pre_hook(_bound(record, path), with_kwargs=True)
        for path in regions(setup, model)
    ]
    try:
        with seeded(setup.config.forward_seed):
            setup.training_step.forwards(model, (clone_inputs(setup.batch[0]), setup.batch[1]))
    finally:
        for handle in handles:
            handle.remove()
    frozen = [path for path, requires_grad in seen.items() if not requires_grad]
    return [p for p in frozen if not any(p.startswith(f"{q}.") for q in frozen)]


def _bound(record, path: str):
    """``record`` with the region's path bound first, as a forward pre-hook (``(module, args, kwargs)``)."""

    def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
        record(path, module, args, kwargs)

    return hook


def set_before_backward(setup: Setup) -> dict[str, tuple[Any, Any, str]]:
    """Module attributes (:func:`reportgen.twins.snapshot.module_attributes`, the keys state parity's ``attribute``
    rows name) whose values differ between a fresh plain and a fresh recompute twin before any backward: as built
    (the model's own switch set them), or after one forward of the fixed batch under the same seeds (the forward
    wrote another value because recompute is on, e.g. reads the switch's flag). No recomputation has run by then, so
    such a difference is not one that recomputing the forward writes again. With the task's own ``forward_backward``
    (its forwards and backward are one call) only the built twins are compared.

    Returns:
        ``{key: (plain value, recompute value, when)}`` in key order, ``when`` being ``"as built"`` or ``"in the
        forward"`` (equal as built, different after the forward).
    """
    plain, recompute = (setup.build(recompute=r, compiled=False) for r in (False, True))
    differ = _differing(module_attributes(plain), module_attributes(recompute), AS_BUILT)
    if setup.training_step.sees_outputs:
        for model in (plain, recompute):
            with seeded(setup.config.forward_seed):  # grad on, as in training: a forward may read it
                setup.training_step.forwards(model, (clone_inputs(setup.batch[0]), setup.batch[1]))
        differ = _differing(module_attributes(plain), module_attributes(recompute), IN_FORWARD) | differ
    return dict(sorted(differ.items()))


#: When :func:`set_before_backward` saw an attribute differ: as the twins were built (the switch set it) or
#: after one forward, before backward (the forward wrote it, because recompute is on).
AS_BUILT, IN_FORWARD = "as built", "in the forward"


def _differing(plain: dict[str, Any], recompute: dict[str, Any], when: str) -> dict[str, tuple[Any, Any, str]]:
    """``{key: (plain, recompute, when)}`` for every key whose value differs (a key one twin lacks: None there)."""
    keys = dict.fromkeys([*plain, *recompute])
    return {k: (plain.get(k), recompute.get(k), when) for k in keys if plain.get(k) != recompute.get(k)}
