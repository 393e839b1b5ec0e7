"""A user's own training step that counts its calls (issue 36, item 7): two accumulated micro-batches and
clipping, on ``user_models.faults.build_dropout``. A check that trains or times a step must call these; one
that ran reportgen's one-forward step instead counts nothing, and measures a step the user does not run."""

from __future__ import annotations

from collections import Counter

import torch

from reportgen.tasks import FunctionTask
from user_models.faults import mse

#: Calls of each member since the last ``CALLS.clear()``.
CALLS: Counter = Counter()


def accumulate(model, batch):
    """Two micro-batches, one backward each, gradients accumulated. Returns the mean loss."""
    CALLS["forward_backward"] += 1
    x, y = batch
    total = 0.0
    for xs, ys in zip(x.chunk(2), y.chunk(2)):
        loss = mse(model(xs), ys) / 2
        loss.backward()
        total += float(loss.detach())
    return torch.tensor(total)


def clip(model, optimizer):
    """Clip the gradients' global norm to 0.1 between backward and the step."""
    CALLS["before_step"] += 1
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)


class PermutingTask(FunctionTask):
    """A task holding its own ``torch.Generator``, from which its step draws a new micro-batch order every step:
    each twin's step must draw alike from it, in every check (the twins step in turn in the trajectory check)."""

    def __init__(self):
        super().__init__(make_batch="user_models.faults.batch_dense", loss="user_models.faults.mse")
        self.order = torch.Generator().manual_seed(99)

    def forward_backward(self, model, batch):
        x, y = batch
        perm = torch.randperm(x.shape[0], generator=self.order)
        return accumulate(model, (x[perm], y[perm]))


def no_loss(model, batch):
    """A broken user step: backward runs, and no loss is returned."""
    x, y = batch
    mse(model(x), y).backward()
