"""The tutorial's feed-forward block: Linear(12, 24), ReLU, Dropout(0.2), Linear(24, 12)."""

from __future__ import annotations

import torch
from torch import nn


class FeedForwardBlock(nn.Module):
    """``x [batch, 12] -> [batch, 12]`` through Linear, ReLU, Dropout, Linear.

    Args:
        width: input/output features (12 in the tutorial).
        hidden: hidden features (24 in the tutorial).
        p: dropout probability (0.2 in the tutorial).
    """

    def __init__(self, width: int = 12, hidden: int = 24, p: float = 0.2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(p), nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [batch, width] -> [batch, width]
        return self.net(x)


def build(width: int = 12, hidden: int = 24, p: float = 0.2) -> nn.Module:
    """The block as the only child of a Sequential, so it can be a recompute target.

    Weights are seeded by the caller (``seed: 47`` in ``conf/model/ffn.yaml``).
    """
    return nn.Sequential(FeedForwardBlock(width, hidden, p))
