"""A twin that owns its step: model, optimizer, scheduler and the training step chosen once for the run
(:mod:`reportgen.twins.step`), as torchtitan's ``Trainer.train_step`` assembles the step once and every loop calls it.

Every loop that trains or times a twin (budget runs, the trajectory, lockstep gradients, the sharded steps, the
detector controls, the memory and time checks) keeps its own iteration and calls :meth:`Twin.step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from reportgen.rng import fingerprint, seeded
from reportgen.tasks import Batch
from reportgen.twins.snapshot import Snapshot, grad_digests, grads_of, take
from reportgen.twins.step import TrainingStep


@dataclass
class Stepped:
    """What one :meth:`Twin.step` did.

    Attributes:
        loss: the step's loss (detached, 0-d).
        rng: every global generator's state right after backward (:func:`reportgen.rng.fingerprint`; empty when
            not asked).
        grads: ``{plain parameter name: gradient or None}`` copied after backward, before anything changed them
            (empty when not asked).
        applied: the gradients were applied (optimizer step); False when ``accept`` refused them.
        grad_digests: ``{plain parameter name: digest of the gradient's bytes or None}`` after backward
            (:func:`reportgen.twins.snapshot.grad_digests`; empty when not asked).
    """

    loss: Tensor
    rng: dict[str, Tensor] = field(default_factory=dict)
    grads: dict[str, Tensor | None] = field(default_factory=dict)
    applied: bool = True
    grad_digests: dict[str, str | None] = field(default_factory=dict)


@dataclass
class Twin:
    """One twin: a model, its optimizer and scheduler, and the run's training step.

    Attributes:
        model: the twin's model (a copy of the one build, in train mode).
        training_step: whose step runs (:func:`reportgen.twins.step.training_step`, chosen once per run).
        optimizer: the optimizer over the trainable parameters.
        scheduler: the learning-rate scheduler, or None.
        last: what the latest :meth:`step` did (None before the first).
    """

    model: nn.Module
    training_step: TrainingStep
    optimizer: torch.optim.Optimizer
    scheduler: Any = None
    last: Stepped | None = None

    @classmethod
    def of(cls, model: nn.Module, training_step: TrainingStep, optimizer_cfg: Any, lr_scale: float = 1.0) -> Twin:
        """``model`` with the step's optimizer (``optimizer_cfg``: a ``_target_`` node, unless the task makes its
        own), every group's learning rate times ``lr_scale`` (the larger-batch rule), and its scheduler."""
        optimizer = training_step.make_optimizer(optimizer_cfg, model)
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * lr_scale
        return cls(model, training_step, optimizer, training_step.make_scheduler(optimizer))

    @property
    def trainable(self) -> list[nn.Parameter]:
        """The parameters that require grad, in ``model.parameters()`` order."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def step(
        self,
        batch: Batch,
        seed: int | None = None,
        *,
        accept: bool | Callable[[Tensor], bool] = True,
        nudge: Callable[[list[nn.Parameter]], None] | None = None,
        keep_grads: bool = False,
        rng: bool = True,
        digest_grads: bool = False,
    ) -> Stepped:
        """One training step on ``batch``: every gradient set to None, the step's forwards and backward under
        ``seeded(seed)`` (:func:`reportgen.rng.seeded`; None: the generators as they are), then, when accepted,
        ``nudge(trainable parameters)`` and the step's ``apply`` (``before_step``, optimizer, scheduler).

        Args:
            batch: ``(inputs, targets)`` on the twin's device, never modified.
            seed: seeds every generator right before the forward; the caller's states come back after.
            accept: apply the gradients (False: backward only, the gradients stay for the caller);
                a callable gets the loss and decides (e.g. skip a non-finite step).
            nudge: the rounding twin's gradient noise, applied right before ``apply``.
            keep_grads: copy the gradients after backward into :attr:`Stepped.grads`.
            rng: read every generator's state right after backward into :attr:`Stepped.rng`.
            digest_grads: hash every gradient after backward into :attr:`Stepped.grad_digests` (no copy kept).

        Raises:
            Exception: whatever the step raises (the task's step refusing its return: :class:`UserStep`).
        """
        self.model.zero_grad(set_to_none=True)  # every parameter's, also those the task's optimizer leaves out
        with seeded(seed):
            loss = self.training_step.forward_backward(self.model, batch)
            states = fingerprint() if rng else {}
        grads = grads_of(self.model) if keep_grads else {}
        digests = grad_digests(self.model) if digest_grads else {}
        applied = accept(loss) if callable(accept) else accept
        if applied:
            self.apply(nudge)
        self.last = Stepped(loss, states, grads, applied, digests)
        return self.last

    def apply(self, nudge: Callable[[list[nn.Parameter]], None] | None = None) -> None:
        """Apply the gradients backward left: ``nudge(trainable parameters)`` first when given, then the step's
        ``apply`` (the task's ``before_step``, the optimizer, the scheduler)."""
        if nudge is not None:
            nudge(self.trainable)
        self.training_step.apply(self.model, self.optimizer, self.scheduler)

    def snapshot(self) -> Snapshot:
        """A view of the twin's state after its latest step (:func:`reportgen.twins.snapshot.take`), valid until it
        steps again. The generators its modules hold are in it; the task's are not (twins stepped in turn each draw
        from their own copy of the task's stream, which is put back after every step).

        Raises:
            RuntimeError: the twin has not stepped yet.
        """
        if self.last is None:
            raise RuntimeError("Twin.snapshot() before any Twin.step()")
        last = self.last
        return take(self.model, self.optimizer, last.rng, last.loss, last.grads, clone=False)


@dataclass
class TrainStep:
    """One training step of a twin on a fixed batch, callable: :meth:`Twin.step` (no generator states read), then
    ``zero_grad(set_to_none=True)``, so between steps only weights and optimizer state are allocated (the baseline
    of a step's peak). What the memory and time checks measure.

    Attributes:
        twin: the twin that steps.
        batch: ``(inputs, targets)``, used as is (never modified).
        forward_seed: seeds every generator before each step (None = leave them alone).
    """

    twin: Twin
    batch: Batch
    forward_seed: int | None = None

    @property
    def model(self) -> nn.Module:
        """The twin's model."""
        return self.twin.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer it steps (a memory tracker counts its state)."""
        return self.twin.optimizer

    def __call__(self) -> None:
        self.twin.step(self.batch, self.forward_seed, rng=False)
        self.twin.optimizer.zero_grad(set_to_none=True)


def timed(step: Callable[[], None], device: torch.device) -> float:
    """Wall time of one call of ``step``, ms, synchronized on both sides on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) * 1e3
