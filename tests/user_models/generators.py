"""A model and a task that hold their own ``torch.Generator`` (issue 36 item 8): state parity compares
each one's state between the twins. ``torch.utils.checkpoint`` replays only the global generators, so a
recomputed block that draws from its own generator advances it twice in the recompute twin."""

import torch
from torch import nn

from reportgen.tasks import FunctionTask
from user_models.faults import mse


class OwnNoise(nn.Module):
    """A block holding ``self._gen``; with ``draw`` its forward adds noise drawn from it before the ``tanh``
    (whose saved output makes the recomputation draw again)."""

    def __init__(self, draw: bool, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.draw = draw
        self._gen = torch.Generator().manual_seed(0)

    def forward(self, x):  # [batch, width]
        h = self.lin(x)
        return torch.tanh(h + 0.01 * torch.randn(h.shape, generator=self._gen) if self.draw else h)


def build(draw: bool = True):
    """Two :class:`OwnNoise` blocks."""
    return nn.Sequential(OwnNoise(draw), OwnNoise(draw))


class NoisyLossTask(FunctionTask):
    """A :class:`FunctionTask` whose loss adds noise from the task's own ``_gen``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._gen = torch.Generator().manual_seed(1)

    def loss(self, output, target):
        return mse(output + 0.01 * torch.randn(output.shape, generator=self._gen), target)
