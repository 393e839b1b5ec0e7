"""Tasks that break the task contract, or raise inside a check (tests/commands/test_integrity.py)."""

from __future__ import annotations

import torch
from torch import nn

from reportgen.tasks import FunctionTask

WIDTH = 8


class Block(nn.Module):
    """``x [batch, 8] -> [batch, 8]``: Linear, GELU, Linear with a residual."""

    def __init__(self):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(WIDTH, 16), nn.GELU(), nn.Linear(16, WIDTH))

    def forward(self, x):
        return x + self.ff(x)


def build():
    """Two blocks in a Sequential (targets: Block)."""
    return nn.Sequential(Block(), Block())


def make_batch(generator, batch_size):
    """The contract kept: ``([b, 8], [b, 8])`` drawn with ``generator``."""
    x = torch.randn(batch_size, WIDTH, generator=generator)
    return x, torch.zeros_like(x)


def make_batch_global_rng(generator, batch_size):
    """Breach: draws from the global RNG, ignoring ``generator``."""
    x = torch.randn(batch_size, WIDTH)
    return x, torch.zeros_like(x)


def make_batch_ints(generator, batch_size):
    """Breach: integer inputs for a model of Linear layers."""
    x = torch.randint(0, 5, (batch_size, WIDTH), generator=generator)
    return x, torch.zeros(batch_size, WIDTH)


def make_batch_fixed_size(generator, batch_size):
    """Breach: always 3 examples, whatever ``batch_size`` asks for."""
    x = torch.randn(3, WIDTH, generator=generator)
    return x, torch.zeros_like(x)


def loss(output, target):
    """The contract kept: mean squared error, a scalar."""
    return (output - target).square().mean()


def loss_per_example(output, target):
    """Breach: one loss per example ``[b]``, not a scalar."""
    return (output - target).square().mean(dim=1)


class ExplodingEvalTask(FunctionTask):
    """Keeps the contract, but ``evaluate`` raises: the task-metrics check becomes an ERROR row."""

    def evaluate(self, model):
        raise ValueError("evaluation exploded on purpose\nsecond line that the console must not show")
