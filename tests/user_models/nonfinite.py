"""A user task whose loss goes non-finite for some training batches (not for held-out ones).

Used by tests/training/test_budget.py through tests/user_conf/model/nonfinite_loss.yaml, the way a user
points reportgen at their own code; imports nothing from reportgen.
"""

import torch
from torch import nn


class TanhBlock(nn.Module):
    """``x + tanh(Linear(x))``, ``[batch, width]``: the recompute target."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.tanh(self.lin(x))


def build(width: int = 8):
    """Two :class:`TanhBlock` behind a linear stem, ``[batch, width] -> [batch, width]``."""
    return nn.Sequential(nn.Linear(width, width), TanhBlock(width), TanhBlock(width))


def is_poisoned(x: torch.Tensor) -> bool:
    """True when a batch's inputs hold a non-finite value (such a batch must be skipped)."""
    return not bool(torch.isfinite(x).all())


class SometimesInfTask:
    """Regression onto the reversed input features; a share of training batches carries an
    ``inf`` input, so their loss is not finite.

    Args:
        width: features per example.
        inf_share: probability that a training batch is poisoned (drawn from the batch generator).
        eval_batches: clean held-out batches of ``eval_batch_size`` examples.
    """

    metric = "loss"
    higher_is_better = False

    def __init__(self, width: int = 8, inf_share: float = 0.3, eval_batches: int = 2, eval_batch_size: int = 32):
        self.width, self.inf_share = width, inf_share
        self.eval_batches, self.eval_batch_size = eval_batches, eval_batch_size

    def _clean(self, generator, batch_size):
        x = torch.randn(batch_size, self.width, generator=generator)
        return x, x.flip(-1)

    def make_batch(self, generator, batch_size):
        """``([b, width], [b, width])``; with probability ``inf_share`` one input is ``inf``."""
        x, y = self._clean(generator, batch_size)
        if float(torch.rand((), generator=generator)) < self.inf_share:
            x[0, 0] = float("inf")
        return x, y

    def loss(self, output, target):
        """Mean squared error, scalar."""
        return (output - target).square().mean()

    def evaluate(self, model):
        """Mean loss over clean held-out batches."""
        generator = torch.Generator().manual_seed(10_007)
        p = next(model.parameters())
        total = 0.0
        for _ in range(self.eval_batches):
            x, y = self._clean(generator, self.eval_batch_size)
            total += float(self.loss(model(x.to(p.device, p.dtype)), y.to(p.device, p.dtype)))
        return {"loss": total / self.eval_batches}
