"""The user's own training step, when the task provides the optional members of
:data:`reportgen.tasks.TRAINING_STEP_MEMBERS` (docs/training_step.md); else reportgen's: one forward, the task's
loss, one backward, ``parity.optimizer``. Seeding and observation stay reportgen's around the user's calls."""

from __future__ import annotations

from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from reportgen.rng import fingerprint, seeded
from reportgen.structure import call_model, clone_inputs
from reportgen.tasks import TRAINING_STEP_MEMBERS, Batch
from reportgen.twins.forward import StepOutput, forward_backward
from reportgen.twins.snapshot import grads_of


def user_members(task: Any) -> list[str]:
    """The training-step members the task provides (in :data:`TRAINING_STEP_MEMBERS` order)."""
    return [name for name in TRAINING_STEP_MEMBERS if callable(getattr(task, name, None))]


def run_forward_backward(task: Any, model: nn.Module, batch: Batch, forward_seed: int | None) -> StepOutput:
    """The task's ``forward_backward`` (seeded, on cloned inputs), else reportgen's
    :func:`reportgen.twins.forward.forward_backward` with ``task.loss``.

    Returns:
        A :class:`StepOutput`; with the user's call it holds the loss it returned (detached), the
        gradients and the generator states after it, and no outputs (the user's forwards are theirs).
    """
    if not callable(getattr(task, "forward_backward", None)):
        return forward_backward(model, batch, task.loss, forward_seed)
    with seeded(forward_seed):
        loss = loss_backward(task, model, batch)
        rng = fingerprint()
    return StepOutput(loss, {}, {}, grads_of(model), rng)


def loss_backward(task: Any, model: nn.Module, batch: Batch) -> torch.Tensor:
    """The forwards and backward(s) of one training step, unseeded: the task's ``forward_backward`` on cloned
    inputs, else one forward, ``task.loss`` and one backward. Returns the loss, detached."""
    user = getattr(task, "forward_backward", None)
    if callable(user):
        loss = user(model, (clone_inputs(batch[0], requires_grad=False), batch[1]))
        return loss.detach() if torch.is_tensor(loss) else torch.tensor(float(loss))
    loss = task.loss(call_model(model, batch[0]), batch[1])
    loss.backward()
    return loss.detach()


def make_optimizer(task: Any, optimizer_cfg: Any, model: nn.Module) -> torch.optim.Optimizer:
    """The task's ``make_optimizer(params)``, else ``optimizer_cfg`` instantiated (trainable parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    factory = getattr(task, "make_optimizer", None)
    return factory(params) if callable(factory) else instantiate(optimizer_cfg, params=params)


def make_scheduler(task: Any, optimizer: torch.optim.Optimizer) -> Any:
    """The task's ``make_lr_scheduler(optimizer)``, else None."""
    factory = getattr(task, "make_lr_scheduler", None)
    return factory(optimizer) if callable(factory) else None


def optimizer_step(task: Any, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
    """``before_step(model, optimizer)`` when the task has it, ``optimizer.step()``, then ``scheduler.step()``."""
    before = getattr(task, "before_step", None)
    if callable(before):
        before(model, optimizer)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()


def step_said(task: Any) -> str:
    """Page 1's line on whose training step the sharded parity checks run."""
    members = user_members(task)
    if not members:
        return "reportgen's: one forward, the task's loss, one backward, parity.optimizer"
    return (
        f"yours ({', '.join(members)}) in the trajectory checks (sharded and single-process, and the detector "
        "control of the later step) and the sharded gradient and optimizer-step checks; reportgen's one forward and "
        "backward in the memory, time and task-metrics checks and in the other single-process checks"
    )
