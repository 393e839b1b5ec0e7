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


class RankBranch(nn.Module):
    """``[batch, width]`` → same shape. On ``rank`` only, every second call scales its input by 1.5
    before the linear layer saves it: a recomputed forward (the second call of a step) then saves
    another input than the first, so recompute changes the weight gradient on that rank alone.
    Other ranks, and a single process, never branch."""

    def __init__(self, width: int = 8, rank: int = 1):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.rank = rank
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if dist.is_initialized() and dist.get_rank() == self.rank and self.calls % 2 == 0:
            x = x * 1.5
        return torch.tanh(self.lin(x))


def build_rank_branch(rank: int = 1, width: int = 8):
    """Two :class:`RankBranch` blocks; the recompute targets are the blocks."""
    return nn.Sequential(RankBranch(width, rank), RankBranch(width, rank))


class SleepsOnRank(nn.Module):
    """``[batch, width]`` → same shape; on ``rank`` the forward sleeps ``seconds`` (a hung rank), first
    creating the file ``started`` when one is named (a test then knows the rank hangs inside a check)."""

    def __init__(self, width: int = 8, rank: int = 1, seconds: float = 600.0, started: str = ""):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.rank, self.seconds, self.started = rank, seconds, started

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and dist.get_rank() == self.rank:
            import time
            from pathlib import Path

            if self.started:
                Path(self.started).touch()
            time.sleep(self.seconds)
        return torch.relu(self.lin(x))


def build_sleeps_on_rank(rank: int = 1, width: int = 8, started: str = ""):
    """Two :class:`SleepsOnRank` blocks (``started``: see :class:`SleepsOnRank`)."""
    return nn.Sequential(SleepsOnRank(width, rank, started=started), SleepsOnRank(width, rank, started=started))
