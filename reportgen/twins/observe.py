"""Which modules recompute, observed: a module whose forward runs again during backward.

:func:`observe_recompute` works for any recomputation (torch's wrappers, selective policies, a
model's own switch) and :func:`observe_twins` records what it sees in the :class:`Setup` before any
check runs; :func:`observation_rows` turns "the switch recomputes nothing" into a finding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from reportgen.config import GRADIENT_PARITY
from reportgen.results import Role, Row
from reportgen.rng import seeded
from reportgen.structure import call_model, clone_inputs
from reportgen.tasks import Batch
from reportgen.twins.recompute import Wrapped, plain_name
from reportgen.twins.setup import Setup, rebuilt_said


def observe_recompute(
    model: nn.Module, batch: Batch, loss_fn: Callable, forward_seed: int | None, whole_modules: bool = False
) -> list[str]:
    """Paths of the modules that actually recompute: whose forward runs again during backward.

    Implementation-agnostic: a global forward pre-hook records every module whose forward
    starts while autograd's engine is running a backward (``torch._C._current_graph_task_id()``
    is not -1), which is what any recomputation (reentrant, non-reentrant, selective, a
    model's own switch) does. Only the outermost such modules are returned (their children
    run again because they do), with recompute-wrapper segments removed.

    Args:
        model: a twin in train mode (not modified; one forward and backward run on it).
        batch: ``(inputs, targets)``.
        loss_fn: ``fn(output, target) -> scalar``.
        forward_seed: seeds every generator for the forward and backward.
        whole_modules: also count a module (not the root) as recomputed when its own hook did not
            run again but every child that ran in the forward did: a switch that recomputes a
            layer's ``forward`` rather than its ``__call__`` (transformers 5's
            ``GradientCheckpointingLayer``) never runs the layer's hooks again. For the model's
            own switch; a childless module recomputed that way stays unseen.

    Returns:
        Module paths in the plain model's naming, in the order they recomputed; empty when
        nothing recomputes.
    """
    from torch.nn.modules.module import register_module_forward_pre_hook

    names = {
        module: plain_name(name) for name, module in model.named_modules() if not isinstance(module, CheckpointWrapper)
    }
    again: list[str] = []
    ran: set[str] = set()

    def record(module: nn.Module, args: Any) -> None:
        if module not in names:
            return
        if torch._C._current_graph_task_id() == -1:
            ran.add(names[module])
        elif names[module] not in again:
            again.append(names[module])

    handle = register_module_forward_pre_hook(record)
    x, y = clone_inputs(batch[0]), batch[1]
    try:
        with seeded(forward_seed):
            loss_fn(call_model(model, x), y).backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    if whole_modules:
        _add_whole_modules(names, ran, again)
    return [p for p in again if not any(p.startswith(q + ".") or (q == "" and p) for q in again if q != p)]


def _add_whole_modules(names: dict, ran: set[str], again: list[str]) -> None:
    """Insert into ``again`` (before its first child) every non-root module that ran in the forward,
    did not run again itself, and whose children that ran and hold parameters all ran again (all
    its children that ran, when none holds parameters); innermost first, so a module whose children
    were added this way counts too. A trailing parameter-free child (a dropout with p=0, an
    activation) that non-reentrant recompute never runs again, because it stops once every saved
    tensor is back, does not hide the layer (GPT-NeoX, Phi-3, StableLM layers end in one)."""
    for module in reversed(list(names)):
        path = names[module]
        children = [c for c in module.children() if c in names and names[c] in ran]
        holders = [names[c] for c in children if any(True for _ in c.parameters())]
        needed = holders or [names[c] for c in children]
        if path and path in ran and path not in again and needed and all(c in again for c in needed):
            again.insert(min(again.index(c) for c in needed), path)


def _runs_eagerly(setup: Setup) -> bool:
    """True when an uncompiled plain twin runs a forward and backward on the fixed batch."""
    try:
        observe_recompute(setup.build(False, compiled=False), setup.batch, setup.task.loss, setup.config.forward_seed)
    except Exception:  # noqa: BLE001 - the model itself is broken; the checks say so
        return False
    return True


def observe_twins(setup: Setup) -> dict[str, Any]:
    """Which modules recompute in each twin, observed (:func:`reportgen.twins.observe.observe_recompute`).

    Returns:
        The :class:`Setup` fields observation found, for :func:`dataclasses.replace`: ``observed`` (recompute
        twin) and ``baseline_recomputes`` (plain twin; a baseline that already recomputes cannot be compared).
        With the model's own switch the observed modules are ``wrapped``. A twin whose forward raises here is
        left to the checks, which turn the exception into rows (``compile_error`` when only compiling fails).

    When the model's own switch ran and nothing recomputes, that is evidence, not a usage error
    (a frozen base under reentrant recompute, e.g. LoRA without ``enable_input_require_grads()``):
    ``nothing_recomputes`` says so and :func:`observation_rows` makes it a FAIL row.
    """
    seed, loss = setup.config.forward_seed, setup.task.loss
    try:
        switch = not setup.wrapped  # the model's own switch may recompute a layer's forward, not its __call__
        plain = setup.build(False)
        baseline = observe_recompute(plain, setup.batch, loss, seed, whole_modules=switch)
        flag = getattr(plain, "is_activation_checkpointing", None)  # transformers 5 (the 4.x name warns there)
        if flag if flag is not None else getattr(plain, "is_gradient_checkpointing", False):
            baseline.append("(model flag is_gradient_checkpointing=True)")
        twin = setup.build(True)
        found: dict[str, Any] = {"baseline_recomputes": baseline}
        found["observed"] = observe_recompute(twin, setup.batch, loss, seed, whole_modules=switch)
    except Exception as exc:  # noqa: BLE001 - the checks report a twin that cannot run
        if setup.config.compile.enabled and _runs_eagerly(setup):  # the model is fine: compiling it is not
            return {"compile_error": f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"}
        return {}
    if not setup.wrapped:  # the model's own switch: trust the observation, not the switch
        classes = {plain_name(n): type(m).__name__ for n, m in twin.named_modules()}
        found["wrapped"] = [Wrapped(path, classes.get(path, "?")) for path in found["observed"]]
        if not found["wrapped"]:
            found["nothing_recomputes"] = (
                f"recompute.enable={setup.config.recompute.enable} ran, but no module of "
                "the recompute twin runs its forward again in backward: nothing recomputes, "
                "so the configured recompute is not what trains"
            )
    return found


def observation_rows(setup: Setup) -> list[Row]:
    """A FAIL row of gradient parity when the model's switch recomputes nothing, and an INFO row saying
    why every twin calls the factory again when a copy cannot stand for a build (else none).

    Judged like every row: ``recomputed_regions >= 1``, so ``reportgen.verify`` re-derives it.
    """
    because, rows = setup.template.rebuilt_because, []
    if because:
        builds, said = "factory_builds_per_twin", rebuilt_said(because)
        rows.append(Row.fact(GRADIENT_PARITY, "twins built by the factory", Role.NOTE, said, metric=builds, value=1.0))
    if setup.nothing_recomputes:
        item, said = "regions recomputed", setup.nothing_recomputes
        judged: dict[str, Any] = {"comparator": ">=", "threshold_value": 1.0, "role": Role.OBSERVED}
        rows.append(Row.measured(GRADIENT_PARITY, item, "recomputed_regions", 0.0, "regions", detail=said, **judged))
    return rows
