"""The training step, chosen once when the setup is built (:func:`training_step`): the task's own where it gives
members of :data:`reportgen.tasks.TRAINING_STEP_MEMBERS` (docs/training_step.md), else reportgen's: one forward,
the task's loss, one backward, the configured optimizer. No module outside this one asks whose step runs: callers
read the step's facts (:attr:`TrainingStep.sees_outputs`, :attr:`TrainingStep.changes_grads`,
:meth:`TrainingStep.said`) and call its members; seeding and observation stay reportgen's around them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from reportgen.structure import call_model, clone_inputs
from reportgen.tasks import TRAINING_STEP_MEMBERS, Batch


@dataclass(frozen=True)
class TrainingStep:
    """reportgen's own training step over ``task``: one forward, ``task.loss``, one backward, the configured
    optimizer (``_target_`` node), no scheduler. :class:`UserStep` replaces what the task gives.

    Attributes:
        task: the task (:class:`reportgen.tasks.Task`): its ``loss(output, target) -> scalar``.
    """

    task: Any

    @property
    def members(self) -> tuple[str, ...]:
        """The task's own members this step runs (none: reportgen's step)."""
        return ()

    @property
    def sees_outputs(self) -> bool:
        """True when reportgen runs the forward: parity sees the outputs and the input gradient (False: the
        task's ``forward_backward`` runs the forwards, and only the loss it returns and the gradients are seen)."""
        return "forward_backward" not in self.members

    @property
    def changes_grads(self) -> bool:
        """True when something between backward and the optimizer step may change the gradients (the task's
        ``before_step``: clipping, unscaling), so a caller that keeps them must copy them first."""
        return "before_step" in self.members

    def forward_loss(self, model: nn.Module, batch: Batch) -> tuple[Any, torch.Tensor]:
        """reportgen's one forward and the task's loss on ``batch`` as given: ``(output, scalar loss)``."""
        output = call_model(model, batch[0])
        return output, self.task.loss(output, batch[1])

    def forward_backward(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The forwards and backward(s) of one step, unseeded. Returns the loss, detached (0-d)."""
        loss = self.forward_loss(model, batch)[1]
        loss.backward()
        return loss.detach()

    def forwards(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """What counting saved activations runs (:func:`reportgen.memory.saved.saved_activation_bytes`): the step's
        forward and loss, no backward, so what autograd keeps is alive when counted. Returns the loss (its graph)."""
        return self.forward_loss(model, batch)[1]

    def make_optimizer(self, optimizer_cfg: Any, model: nn.Module) -> torch.optim.Optimizer:
        """``optimizer_cfg`` (a ``_target_`` node) instantiated over the trainable parameters."""
        return instantiate(optimizer_cfg, params=[p for p in model.parameters() if p.requires_grad])

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """The learning-rate scheduler over ``optimizer``, or None."""
        return None

    def apply(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
        """Apply the gradients: ``optimizer.step()``, then ``scheduler.step()`` when there is one."""
        optimizer.step()
        if scheduler is not None:
            scheduler.step()

    def said(self) -> str:
        """Page 1's line on whose training step each check ran."""
        return "reportgen's in every check: one forward, the task's loss, one backward, the configured optimizer"


@dataclass(frozen=True)
class UserStep(TrainingStep):
    """The task's own training step, member by member (:data:`reportgen.tasks.TRAINING_STEP_MEMBERS`); a member
    the task does not give stays reportgen's.

    Attributes:
        given: the members the task gives, in :data:`~reportgen.tasks.TRAINING_STEP_MEMBERS` order.
    """

    given: tuple[str, ...] = ()

    @property
    def members(self) -> tuple[str, ...]:
        """The task's own members this step runs."""
        return self.given

    def forward_backward(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The task's ``forward_backward(model, batch)`` on cloned inputs (else reportgen's). Returns its loss,
        detached (a number becomes a 0-d tensor).

        Raises:
            TypeError: it returned no loss (None, a per-example vector, an object).
            ValueError: it left the model in eval mode (its dropout would hide a recompute fault).
        """
        if self.sees_outputs:
            return super().forward_backward(model, batch)
        loss = self.task.forward_backward(model, (clone_inputs(batch[0], requires_grad=False), batch[1]))
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

    def forwards(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """The task's ``forward_backward`` whole (else reportgen's forward and loss): every forward of the step is
        counted as it saves, summed (its backward frees what one micro-batch kept before the next runs)."""
        return super().forwards(model, batch) if self.sees_outputs else self.forward_backward(model, batch)

    def make_optimizer(self, optimizer_cfg: Any, model: nn.Module) -> torch.optim.Optimizer:
        """The task's ``make_optimizer(params)`` over the trainable parameters (else reportgen's).

        Raises:
            TypeError: it returned something that is not a ``torch.optim.Optimizer``.
        """
        if "make_optimizer" not in self.given:
            return super().make_optimizer(optimizer_cfg, model)
        optimizer = self.task.make_optimizer([p for p in model.parameters() if p.requires_grad])
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"task.make_optimizer(params) returned {type(optimizer).__name__}, not a torch.optim.Optimizer: "
                "return the optimizer built over the params it is given (e.g. torch.optim.AdamW(params, lr=1e-3))"
            )
        return optimizer

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """The task's ``make_lr_scheduler(optimizer)``, else None."""
        return self.task.make_lr_scheduler(optimizer) if "make_lr_scheduler" in self.given else None

    def apply(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None) -> None:
        """The task's ``before_step(model, optimizer)`` when it gives one, then reportgen's."""
        if "before_step" in self.given:
            self.task.before_step(model, optimizer)
        super().apply(model, optimizer, scheduler)

    def said(self) -> str:
        """Page 1's line on whose training step each check ran."""
        return (
            f"yours ({', '.join(self.given)}) in every check that trains or times a step: gradient, optimizer-step, "
            "trajectory and distributed parity, warm-step memory and time, task metrics, larger batch and the "
            "detector controls; reportgen's one forward and loss in the GPU-free memory estimate and the recompute "
            "observation. With your forward_backward, parity compares the loss and gradients only (your forwards' "
            "outputs are yours)"
        )


def training_step(task: Any) -> TrainingStep:
    """The step every twin of the run takes, chosen once: :class:`UserStep` when ``task`` gives any member of
    :data:`~reportgen.tasks.TRAINING_STEP_MEMBERS` (a callable attribute), else reportgen's :class:`TrainingStep`."""
    given = tuple(name for name in TRAINING_STEP_MEMBERS if callable(getattr(task, name, None)))
    return UserStep(task, given) if given else TrainingStep(task)
