"""Residual MLP blocks with dropout, a classifier of 8×8 digits images."""

from __future__ import annotations

import torch
from torch import nn


class ResidualMLPBlock(nn.Module):
    """Pre-norm residual MLP: ``x + Dropout(W2 GELU(W1 LN(x)))``, ``[batch, width]`` in and out.

    Args:
        width: features of the residual stream.
        hidden: features inside the block (4 × width is the usual choice).
        p: dropout probability.
    """

    def __init__(self, width: int, hidden: int, p: float):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(nn.functional.gelu(self.up(self.norm(x)))))


class DigitsMLP(nn.Module):
    """``x [batch, 64]`` pixels in [0, 1] → logits ``[batch, classes]``.

    Args:
        in_features: pixels per image (64 for 8×8 digits).
        width: residual stream features.
        depth: number of :class:`ResidualMLPBlock`.
        hidden: block hidden features.
        p: dropout probability.
        classes: output classes.
    """

    def __init__(
        self,
        in_features: int = 64,
        width: int = 128,
        depth: int = 4,
        hidden: int = 512,
        p: float = 0.1,
        classes: int = 10,
    ):
        super().__init__()
        self.embed = nn.Linear(in_features, width)
        self.blocks = nn.Sequential(*[ResidualMLPBlock(width, hidden, p) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(x))))
