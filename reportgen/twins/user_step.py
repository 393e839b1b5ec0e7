"""The user's own training step, when the task provides the optional members of
:data:`reportgen.tasks.TRAINING_STEP_MEMBERS` (docs/training_step.md); else reportgen's: one forward, the task's
loss, one backward, the configured optimizer. Every check that trains or times a step runs it through these
functions; seeding and observation stay reportgen's around the user's calls."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from reportgen.structure import call_model, clone_inputs
from reportgen.tasks import TRAINING_STEP_MEMBERS, Batch


def user_members(task: Any) -> list[str]:
    """The training-step members the task provides (in :data:`TRAINING_STEP_MEMBERS` order)."""
    return [name for name in TRAINING_STEP_MEMBERS if callable(getattr(task, name, None))]


def runs_own_forwards(task: Any) -> bool:
    """True when the task gives its own ``forward_backward``: its forwards, outputs and inputs are the user's, and
    reportgen sees only the loss it returns and the gradients it leaves."""
    return callable(getattr(task, "forward_backward", None))


def own_step(task: Any) -> Any:
    """The task seen with reportgen's own step only (its ``loss``, none of the user's members): for the
    GPU-free estimate, whose fake tensors a user's step may not accept (``float(loss)``)."""
    return SimpleNamespace(loss=task.loss)


def loss_backward(task: Any, model: nn.Module, batch: Batch) -> torch.Tensor:
    """The forwards and backward(s) of one training step, unseeded: the task's ``forward_backward(model, batch)``
    on cloned inputs, else one forward, ``task.loss`` and one backward. Returns the loss, detached (a number the
    user's step returns becomes a 0-d tensor).

    Raises:
        TypeError: the task's ``forward_backward`` returned no loss (None, a per-example vector, an object).
        ValueError: it left the model in eval mode (its dropout would hide a recompute fault).
    """
    if runs_own_forwards(task):
        loss = task.forward_backward(model, (clone_inputs(batch[0], requires_grad=False), batch[1]))
        if not model.training:  # every twin trains in train mode: dropout was off, a fault inside it could not show
            raise ValueError(
                "task.forward_backward(model, batch) left the model in eval mode (model.training is False), so its "
                "dropout and batch statistics did not train: call model.train() again after evaluating in your step"
            )
        if isinstance(loss, (int, float)) or torch.is_tensor(loss) and loss.numel() == 1:
            return loss.detach().reshape(()) if torch.is_tensor(loss) else torch.tensor(float(loss))
        said = f"a tensor of shape {list(loss.shape)}" if torch.is_tensor(loss) else type(loss).__name__
        raise TypeError(
            f"task.forward_backward(model, batch) returned {said}, not the step's loss: return one number or a "
            "one-element tensor (e.g. the mean of the micro-batches' losses), after calling backward yourself"
        )
    loss = task.loss(call_model(model, batch[0]), batch[1])
    loss.backward()
    return loss.detach()


def make_optimizer(task: Any, optimizer_cfg: Any, model: nn.Module) -> torch.optim.Optimizer:
    """The task's ``make_optimizer(params)``, else ``optimizer_cfg`` (a ``_target_`` node) instantiated, over
    the trainable parameters.

    Raises:
        TypeError: the task's factory returned something that is not a ``torch.optim.Optimizer``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    factory = getattr(task, "make_optimizer", None)
    if not callable(factory):
        return instantiate(optimizer_cfg, params=params)
    optimizer = factory(params)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"task.make_optimizer(params) returned {type(optimizer).__name__}, not a torch.optim.Optimizer: "
            "return the optimizer built over the params it is given (e.g. torch.optim.AdamW(params, lr=1e-3))"
        )
    return optimizer


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
    """Page 1's line on whose training step each check ran."""
    members = user_members(task)
    if not members:
        return "reportgen's in every check: one forward, the task's loss, one backward, the configured optimizer"
    return (
        f"yours ({', '.join(members)}) in every check that trains or times a step: gradient, optimizer-step, "
        "trajectory and distributed parity, warm-step memory and time, task metrics, larger batch and the detector "
        "controls; reportgen's one forward and loss in the GPU-free memory estimate and the recompute observation. "
        "With your forward_backward, parity compares the loss and gradients only (your forwards' outputs are yours)"
    )
