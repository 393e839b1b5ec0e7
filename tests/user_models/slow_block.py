"""A model with one deliberately slow block, for comparisons of recompute targets.

``Slow`` sleeps ``delay_s`` in every forward, so recomputing it adds that delay to each
training step (the recompute twin runs its forward twice); ``Fast`` costs next to nothing.
Recomputing ``Slow`` instead of ``Fast`` raises the step-time overhead ratio by a known,
noise-proof amount.
"""

import time

import torch
from torch import nn


class Fast(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):  # [batch, width]
        return torch.relu(self.lin(x))


class Slow(nn.Module):  # not a Fast subclass: recompute targets match base classes too
    def __init__(self, width: int = 16, delay_s: float = 0.02):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.delay_s = delay_s

    def forward(self, x):  # [batch, width]
        time.sleep(self.delay_s)
        return torch.relu(self.lin(x))


def build(width: int = 16, delay_s: float = 0.02):
    return nn.Sequential(Fast(width), Slow(width, delay_s), nn.Linear(width, width))


def make_batch(generator, batch_size=8, width=16):
    x = torch.randn(batch_size, width, generator=generator)
    return x, torch.zeros_like(x)


def loss(output, target):
    return (output - target).square().mean()
