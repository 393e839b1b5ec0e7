"""Models whose step peak tells a different story from their saved bytes (tests/memory/test_peak.py).

* ``build_stack``: 6 residual feed-forward ``Layer`` s inside one ``Stack``. One recompute
  region around the ``Stack`` keeps almost nothing after the forward, but backward recomputes
  the whole stack at once, so every layer's activations are alive together again and the
  step's peak does not move; one region per ``Layer`` lowers it.
* ``build_relus``: recompute only the ``RecomputedReLU`` s. Each region keeps its input for
  the recompute while the next Linear still keeps the ReLU's output: more is kept than
  without recompute.
"""

import torch
from torch import nn

WIDTH, DEPTH, FEATURES = 16, 6, 8


class Layer(nn.Module):
    """``x + W2 gelu(W1 LayerNorm(x))`` on ``[batch, width]``."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Stack(nn.Module):
    def __init__(self, width: int = WIDTH, depth: int = DEPTH):
        super().__init__()
        self.layers = nn.Sequential(*[Layer(width) for _ in range(depth)])

    def forward(self, x):
        return self.layers(x)


class StackNet(nn.Module):
    def __init__(self, width: int = WIDTH, depth: int = DEPTH):
        super().__init__()
        self.stem = nn.Linear(FEATURES, width)
        self.body = Stack(width, depth)
        self.head = nn.Linear(width, 4)

    def forward(self, x):  # [batch, FEATURES] -> [batch, 4]
        return self.head(self.body(self.stem(x)))


def build_stack(width: int = WIDTH, depth: int = DEPTH):
    return StackNet(width, depth)


def batch_regression(generator, batch_size: int = 128):
    """``x [batch, FEATURES]``, target ``[batch, 4]`` (cumulative sums of x's first 4 features)."""
    x = torch.randn(batch_size, FEATURES, generator=generator)
    return x, x[:, :4].cumsum(-1)


def mse(output, target):
    return (output - target).square().mean()


class RecomputedReLU(nn.ReLU):
    """A ReLU that the recompute twin wraps (and nothing else)."""


def build_relus(width: int = 32, depth: int = 4):
    layers = [nn.Linear(FEATURES, width)]
    for _ in range(depth):
        layers += [RecomputedReLU(), nn.Linear(width, width)]
    layers += [RecomputedReLU(), nn.Linear(width, 10)]
    return nn.Sequential(*layers)


def batch_classes(generator, batch_size: int = 64):
    """``x [batch, FEATURES]``, class ids ``[batch]`` in 0..9."""
    return torch.randn(batch_size, FEATURES, generator=generator), torch.randint(
        0, 10, (batch_size,), generator=generator
    )


def cross_entropy(output, target):
    return nn.functional.cross_entropy(output, target)
