"""Models for the distributed-wrapping tests (issue 23), written for them: each rebuilds one public
report of recomputation going wrong (or right) under DDP / FSDP, at a size 2 CPU ranks run in seconds.
Batches are ``user_models.faults.batch_small`` (``[batch, 8]`` inputs, zero targets, MSE)."""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
from torch import nn


class SharedBlock(nn.Module):
    """``[batch, width]`` → same shape: ``tanh(lin(x))``. Applied twice per forward by :class:`TwiceNet`."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


class TwiceNet(nn.Module):
    """``[batch, width]`` → same shape: an input layer, one :class:`SharedBlock` applied twice
    (weight sharing, as in ALBERT or a recurrent cell), and a head. Under DDP with reentrant
    recompute the block's parameters become ready twice in one backward."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.block = SharedBlock(width)
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.block(self.inp(x))))


def build_twice(width: int = 8) -> nn.Module:
    """:class:`TwiceNet`; recompute targets ``[SharedBlock]``."""
    return TwiceNet(width)


class UnusedNet(nn.Module):
    """``[batch, width]`` → same shape through two residual blocks; ``spare`` is a parameter the
    forward never uses: plain DDP (``find_unused_parameters=False``) never finishes its reduction,
    so the ranks drift after the first step and the next forward raises, recompute or not."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.blocks = nn.ModuleList(SharedBlock(width) for _ in range(2))
        self.spare = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def build_unused(width: int = 8) -> nn.Module:
    """:class:`UnusedNet`; recompute targets ``[SharedBlock]``."""
    return UnusedNet(width)


class KilledOnRank(nn.Module):
    """``[batch, width]`` → same shape; on ``rank`` (once a process group exists) the process sends
    itself SIGKILL in forward, as the kernel's out-of-memory killer would."""

    def __init__(self, width: int = 8, rank: int = 1):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.is_initialized() and dist.get_rank() == self.rank:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.tanh(self.lin(x))


def build_killed(width: int = 8) -> nn.Module:
    """Two :class:`KilledOnRank` blocks; recompute targets ``[KilledOnRank]``."""
    return nn.Sequential(KilledOnRank(width), KilledOnRank(width))


def wrap_ddp_static(model: nn.Module, mesh) -> nn.Module:
    """A user's own ``distributed.wrap``: DDP with a static graph, written as a team would."""
    from torch.nn.parallel import DistributedDataParallel

    del mesh
    return DistributedDataParallel(model, static_graph=True)
