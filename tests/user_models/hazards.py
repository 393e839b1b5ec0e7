"""Models whose recompute never ends: reportgen must stop the check, not hang (reportgen/limits.py)."""

import time

import torch
from torch import nn


class NeverReturns(nn.Module):
    """A block whose forward, when run again inside backward (i.e. recomputed), never returns."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):  # x: [batch, width]
        if torch._C._current_graph_task_id() != -1:  # inside a backward pass: being recomputed
            while True:
                time.sleep(0.01)
        return torch.relu(self.lin(x))


def build_never_returns():
    """Two blocks; recomputing either of them hangs."""
    return nn.Sequential(NeverReturns(), NeverReturns())


def batch(generator, batch_size=4):
    """``(x [batch, 8], zeros)``."""
    x = torch.randn(batch_size, 8, generator=generator)
    return x, torch.zeros_like(x)


def mse(output, target):
    return (output - target).square().mean()
