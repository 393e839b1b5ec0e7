"""User models for the verdict-truth tests (issue 8): each is healthy or faulty in a way a
one-step, torch-RNG-only view gets wrong. Imports nothing from reportgen.

- :func:`build_layerdrop`: LayerDrop decided with Python's ``random`` outside the recomputed
  layer (healthy: PASS once both twins see the same coin flips).
- :func:`build_force`: ``torch.autograd.grad`` inside the recomputed block (healthy; the FLOP
  counter cannot count it under reentrant recomputation).
- :func:`build_observer`: a running scale kept as a plain tensor attribute, read in forward and
  updated after it: updated twice per step under recomputation, so step 1 is equal and later
  steps are not (FAIL, first diverging step 2).
- :func:`build_noisy`: noise seeded from ``os.urandom`` in forward: the plain twin does not
  reproduce itself (INCONCLUSIVE).
- :func:`build_nan`: a loss that is NaN in both twins (INCONCLUSIVE, never PASS).
"""

import os
import random

import torch
from torch import nn


def mse(output, target):
    """Mean squared error, scalar."""
    return (output - target).square().mean()


def batch_wide(generator, batch_size=8, width=16):
    """``([batch, width], zeros)`` drawn with ``generator``."""
    x = torch.randn(batch_size, width, generator=generator)
    return x, torch.zeros_like(x)


class EncoderLayer(nn.Module):
    """``x + FF(LayerNorm(x))``, ``[batch, width]``: the recompute target."""

    def __init__(self, width=16):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class LayerDropEncoder(nn.Module):
    """Layers skipped with probability ``layerdrop`` by a Python ``random`` coin in the loop."""

    def __init__(self, depth=4, width=16, layerdrop=0.5):
        super().__init__()
        self.stem = nn.Linear(width, width)  # the layers' input requires grad (reentrant needs one)
        self.layers = nn.ModuleList([EncoderLayer(width) for _ in range(depth)])
        self.head = nn.Linear(width, width)
        self.layerdrop = layerdrop

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            if self.training and random.random() < self.layerdrop:
                continue
            x = layer(x)
        return self.head(x)


def build_layerdrop():
    return LayerDropEncoder()


class ForceBlock(nn.Module):
    """``h - step * dE/dh`` with ``E = sum(softplus(W h))``, gradient taken inside the block."""

    def __init__(self, width=16, step=0.1):
        super().__init__()
        self.energy = nn.Linear(width, width)
        self.step = step

    def forward(self, h):
        with torch.enable_grad():
            h_in = h if h.requires_grad else h.detach().requires_grad_(True)
            energy = nn.functional.softplus(self.energy(h_in)).sum()
            (force,) = torch.autograd.grad(energy, h_in, create_graph=True)
        return h - self.step * force


def build_force():
    return nn.Sequential(nn.Linear(16, 16), ForceBlock(), ForceBlock(), nn.Linear(16, 16))


class Observer(nn.Module):
    """``Linear(x) + shift``; then ``shift`` follows the input's mean (a plain tensor attribute,
    not a buffer), updated once per forward: twice per step under recomputation. The shift does
    not enter this step's gradients (an additive constant), so step 1 is equal everywhere."""

    def __init__(self, width=16):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.shift = torch.zeros(())

    def forward(self, x):
        shift = self.shift  # read, then updated before the rest of the forward (so a
        self.shift = 0.5 * shift + 0.5 * x.detach().mean() + 0.1  # recomputation that stops early still runs it)
        return self.lin(x) + shift


def build_observer():
    return nn.Sequential(nn.Linear(16, 16), Observer(), nn.Tanh(), nn.Linear(16, 16))


class Noisy(nn.Module):
    """Adds noise seeded from the operating system, not from any seeded generator."""

    def __init__(self, width=16):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        return self.lin(x) + 0.1 * torch.randn(x.shape, generator=generator)


def build_noisy():
    return nn.Sequential(Noisy(), nn.Linear(16, 16))


def nan_loss(output, target):
    """A loss that is NaN whatever the twin: ``0/0`` times the MSE."""
    return mse(output, target) * (torch.zeros(()) / torch.zeros(()))


def build_plain():
    return nn.Sequential(EncoderLayer(), EncoderLayer(), nn.Linear(16, 16))
