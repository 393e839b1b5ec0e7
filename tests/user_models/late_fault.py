"""A fault that switches on late in training: each block counts its own forward calls (in a
module-level table, not a module attribute, so state parity cannot see it) and scales its output
by 1.002 after 20 calls, like a schedule keyed to forward calls. Recomputation runs the forward
twice per step, so the recompute twin reaches the switch at step 11 of a 16-step budget run and
the plain twin never does. Gradient, one-step and trajectory parity (fresh twins, a few steps)
are bitwise equal; only the budget run shows it, and its trained parameters move by about the
learning rate, as rounding noise under Adam would: the rounding envelope must not pass it.
Found by trying to break the envelope (gate over the first steps only)."""

from __future__ import annotations

import weakref

import torch
from torch import nn

_CALLS: weakref.WeakKeyDictionary[nn.Module, int] = weakref.WeakKeyDictionary()
THRESHOLD, SCALE = 20, 1.002


class CountingBlock(nn.Module):
    """``x + ff(x) * s``, ``s`` = 1.002 once this block has run more than 20 forwards."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        calls = _CALLS.get(self, 0) + 1
        _CALLS[self] = calls
        return x + self.ff(x) * (SCALE if calls > THRESHOLD else 1.0)


def build_late_fault(depth: int = 4) -> nn.Module:
    """``depth`` CountingBlocks of width 32."""
    return nn.Sequential(*[CountingBlock() for _ in range(depth)])


def batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x ~ N(0, 1)`` of shape ``[batch_size, 32]``, target ``tanh(flip(x))``."""
    x = torch.randn(batch_size, 32, generator=generator)
    return x, torch.tanh(x.flip(-1))


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error."""
    return (output - target).square().mean()
