"""Models for the sharded (distributed) tests, written for them: a block that raises on one rank."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class RankFault(nn.Module):
    """``[batch, width]`` → same shape; raises ``ValueError`` in forward on ``rank`` once a
    process group exists (single-process setup still builds and observes it)."""

    def __init__(self, width: int = 8, rank: int = 1):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and dist.get_rank() == self.rank:
            raise ValueError(f"deliberate fault on rank {self.rank}")
        return torch.relu(self.lin(x))


def build_raises_on_rank(rank: int = 1, width: int = 8):
    """Two :class:`RankFault` blocks; the recompute targets are the blocks."""
    return nn.Sequential(RankFault(width, rank), RankFault(width, rank))
