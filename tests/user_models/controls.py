"""Models for the detector controls (tests/checks/test_controls.py): a recomputed block the loss does not
depend on, and a recomputed block that holds a buffer. None imports reportgen."""

import torch
from torch import nn


def mse(output, target):
    """Mean squared error, scalar."""
    return (output - target).square().mean()


def batch_dense(generator, batch_size=8, width=12):
    """``(x, 0)``, both ``[batch, width]``."""
    x = torch.randn(batch_size, width, generator=generator)
    return x, torch.zeros_like(x)


class Inner(nn.Module):
    """``Linear, GELU, Dropout(p), Linear`` on ``[batch, width]``: the recompute target."""

    def __init__(self, width: int = 12, p: float = 0.2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(p), nn.Linear(2 * width, width))

    def forward(self, x):
        return self.net(x)


class DeadBlock(nn.Module):
    """``x + 0 * inner(x)``: the recomputed ``inner`` runs (and recomputes), but its output is multiplied by
    zero, so the loss does not depend on it and its parameters' gradients are 0."""

    def __init__(self, width: int = 12):
        super().__init__()
        self.inner = Inner(width)

    def forward(self, x):
        return x + 0.0 * self.inner(x)


def build_dead(width: int = 12):
    """``Linear -> DeadBlock -> Linear``, ``[batch, width]`` in and out."""
    return nn.Sequential(nn.Linear(width, width), DeadBlock(width), nn.Linear(width, width))


class ScaledBlock(nn.Module):
    """``Linear(x) * scale`` with ``scale`` a constant floating buffer (ones): a recomputed region with state."""

    def __init__(self, width: int = 12):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.register_buffer("scale", torch.ones(width))

    def forward(self, x):
        return torch.tanh(self.lin(x)) * self.scale


def build_scaled(width: int = 12):
    """``Linear -> ScaledBlock -> Linear``, ``[batch, width]`` in and out."""
    return nn.Sequential(nn.Linear(width, width), ScaledBlock(width), nn.Linear(width, width))


def zero_grads(model, optimizer):
    """A user ``before_step`` that zeroes every gradient before the optimizer step: the step moves nothing."""
    del optimizer
    for p in model.parameters():
        if p.grad is not None:
            p.grad.zero_()


class QuantizedBlock(nn.Module):
    """``Linear`` whose output passes a quantisation-aware-training observer (``torch.ao`` ``FakeQuantize``, observer
    and fake quantisation on): its min/max buffers move every time the block runs, so a recomputation in backward
    moves them again, and later steps quantise with another scale (issue 43's held-out "state changed by
    recomputation" case)."""

    def __init__(self, width: int = 12):
        super().__init__()
        from torch.ao.quantization import FakeQuantize, MovingAverageMinMaxObserver

        self.lin = nn.Linear(width, width)
        self.quant = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)

    def forward(self, x):
        return self.quant(torch.tanh(self.lin(x)))


def build_quantized(width: int = 12):
    """``Linear -> QuantizedBlock -> Linear``, ``[batch, width]`` in and out."""
    return nn.Sequential(nn.Linear(width, width), QuantizedBlock(width), nn.Linear(width, width))
