"""Models whose diagnosis must not be guessed from a symptom (issue 43, item 6): gradients lost under reentrant
recompute for a cause non-reentrant recompute does not cure, and flags that the model's own recompute switch sets.
Imports nothing from reportgen."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

WIDTH = 8


class Swapping(nn.Module):
    """``h + tanh(lin(h))`` on ``[batch, width]``, where ``lin`` is ``proj`` on odd forward calls and ``spare`` on
    even ones (a forward that reads its own call counter). Under recompute the region's recomputation is its second
    call: reentrant recompute backpropagates through ``spare``, so ``proj`` gets no gradient (None) where the plain
    twin's has one; non-reentrant recompute keeps the forward's graph but unpacks the saved tensors the
    recomputation made through ``spare``, so ``proj``'s gradient differs. Either way the counter reads 2, not 1."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.spare = nn.Linear(width, width)
        self.calls = 0

    def forward(self, h):
        self.calls += 1
        lin = self.proj if self.calls % 2 else self.spare
        return h + torch.tanh(lin(h))


class SwappingNet(nn.Module):
    """``head(blocks(stem(x)))``, ``[batch, width] -> [batch, width]``. ``frozen_input``: the first block reads the
    batch itself (which does not require grad) instead of a trainable stem's output."""

    def __init__(self, frozen_input: bool = False, width: int = WIDTH):
        super().__init__()
        self.stem = nn.Identity() if frozen_input else nn.Linear(width, width)
        self.blocks = nn.Sequential(Swapping(width), Swapping(width))
        self.head = nn.Linear(width, width)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def build_swapping(frozen_input: bool = False) -> nn.Module:
    return SwappingNet(frozen_input)


class SwitchedLayer(nn.Module):
    """``h + tanh(lin(h))``; recomputes itself when its model's switch is on (``self.recompute``) and then records it
    in forward (``self.training_switch = True``), the way layers of model libraries keep such flags."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.recompute = False
        self.training_switch = False

    def _forward(self, h):
        return h + torch.tanh(self.lin(h))

    def forward(self, h):
        if self.recompute and self.training:
            self.training_switch = True
            return checkpoint(self._forward, h, use_reentrant=False)
        return self._forward(h)


class SwitchedNet(nn.Module):
    """``head(layers(stem(x)))`` on ``[batch, width]``, with its own switch (:meth:`recompute_on`)."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.layers = nn.Sequential(SwitchedLayer(width), SwitchedLayer(width))
        self.head = nn.Linear(width, width)

    def recompute_on(self) -> None:
        """The model's own switch: every layer recomputes itself."""
        for layer in self.layers:
            layer.recompute = True

    def forward(self, x):
        return self.head(self.layers(self.stem(x)))


def build_switched() -> nn.Module:
    return SwitchedNet()


def switch_on(model, recompute_cfg) -> None:
    """A user's switch for ``recompute.method=model_switch`` (non-reentrant whatever the mode)."""
    model.recompute_on()
