"""Factories that count their calls and build what a copy of a model must keep exact.

``build_counted``: the tutorial's ffn, each call counted in :data:`CALLS` (one per process is
the contract of reportgen.twins.template). ``build_tricky``: tied weights, a non-persistent
buffer, a parametrization, a plain attribute and hooks (a bound method, and a closure over a
submodule, which a copy cannot rebind).
"""

from __future__ import annotations

import threading

import torch
from torch import nn
from torch.nn.utils import parametrize

from reportgen.models.ffn import build

CALLS = {"count": 0}


def build_counted(**kwargs) -> nn.Module:
    """``reportgen.models.ffn.build(**kwargs)``, counted."""
    CALLS["count"] += 1
    return build(**kwargs)


class Symmetric(nn.Module):
    """Parametrization ``W -> triu(W) + triu(W, 1).T``."""

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w.triu() + w.triu(1).transpose(-1, -2)


class Tricky(nn.Module):
    """Embedding tied to the head, a symmetric middle layer, a non-persistent scale buffer,
    a call counter attribute kept by a bound-method forward hook."""

    def __init__(self, vocab: int = 11, width: int = 6):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mid = nn.Linear(width, width)
        parametrize.register_parametrization(self.mid, "weight", Symmetric())
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.rand(width), persistent=False)
        self.calls = 0
        self.register_forward_hook(self.count)

    def count(self, module, args, output) -> None:
        """Forward hook: one more call."""
        self.calls += 1

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.mid(self.embed(ids)) * self.scale)


def build_tricky(closure_hook: bool = False) -> nn.Module:
    """A :class:`Tricky`; ``closure_hook`` adds a hook on ``mid`` that is a closure over ``head``."""
    model = Tricky()
    if closure_hook:
        head = model.head
        model.mid.register_forward_hook(lambda module, args, output: head.weight.sum())
    return model


def build_tricky_ffn(**kwargs) -> nn.Module:
    """The tutorial's ffn with a forward hook on its block that is a closure over the block's first layer
    and counts the block's calls in a buffer of that layer (counted)."""
    CALLS["count"] += 1
    model = build(**kwargs)
    first = model[0].net[0]
    first.register_buffer("calls", torch.zeros(()))

    def count(module, args, output):
        first.calls += 1

    model[0].register_forward_hook(count)
    return model


def build_locked_ffn(**kwargs) -> nn.Module:
    """The tutorial's ffn holding a ``threading.Lock``, which ``copy.deepcopy`` refuses (counted)."""
    CALLS["count"] += 1
    model = build(**kwargs)
    model.lock = threading.Lock()
    return model
