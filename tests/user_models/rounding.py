"""A healthy model on which recomputation differs from the plain run at rounding level only
(issue 16, item 4). Imports nothing from reportgen.

Under reentrant recomputation the first forward of a region runs under ``torch.no_grad()``
and the region is run again with grad enabled in backward. :class:`Reassociated` takes a
mathematically equal but differently summed path when grad is off, so the recompute twin's
region outputs (and everything downstream) differ from the plain twin's in the last bits, as a
compiler re-associating a sum would make them. :class:`CenteredHead` adds a scalar ``shift``
before centering the features: its gradient is zero in exact arithmetic and rounding noise in
float32, and Adam divides that noise by the root of an equally tiny second moment, so a
rounding-level gradient difference becomes a step of about the learning rate.
"""

import torch
from torch import nn


def mse(output, target):
    """Mean squared error, scalar."""
    return (output - target).square().mean()


def batch_shifted(generator, batch_size=8, width=16):
    """``([batch, width] inputs, [batch, width] targets)``: the target is the input rolled by one
    feature and halved, so the model has something to learn."""
    x = torch.randn(batch_size, width, generator=generator)
    return x, 0.5 * x.roll(1, dims=-1)


class Reassociated(nn.Module):
    """``tanh(x W^T + b)``, ``[batch, width] -> [batch, width]``; with grad off (reentrant
    recompute's first forward, evaluation) the product is summed as two halves of the inner
    dimension: equal in exact arithmetic, rounded differently."""

    def __init__(self, width=16):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        w, b = self.lin.weight, self.lin.bias
        if torch.is_grad_enabled():
            return torch.tanh(x @ w.t() + b)
        h = x.shape[-1] // 2
        return torch.tanh((x[:, :h] @ w[:, :h].t() + x[:, h:] @ w[:, h:].t()) + b)


class CenteredHead(nn.Module):
    """``Linear((x + shift) - mean_features(x + shift))``: ``shift`` (one number) cancels in the
    centering, so its gradient is rounding noise (0 in exact arithmetic)."""

    def __init__(self, width=16):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(1))
        self.out = nn.Linear(width, width)

    def forward(self, x):
        z = x + self.shift
        return self.out(z - z.mean(-1, keepdim=True))


def build_rounding():
    """``Linear -> Reassociated -> Reassociated -> CenteredHead``, width 16."""
    return nn.Sequential(nn.Linear(16, 16), Reassociated(), Reassociated(), CenteredHead())
