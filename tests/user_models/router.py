"""A mixture-of-experts block that routes each example to one expert by its gate's argmax: how many examples each
expert gets, and so the shapes it saves for backward, depend on the activations. A healthy recomputation routes
alike; a fault that moves the block's input reroutes, and torch's non-reentrant recompute then raises its
CheckpointError (saved tensors of another shape). None imports reportgen."""

import torch
from torch import nn


class Router(nn.Module):
    """``x + sum_e expert_e(x[routed to e])`` on ``[batch, width]``, top-1 routing by ``gate(x).argmax``."""

    def __init__(self, width: int = 12, experts: int = 3):
        super().__init__()
        self.gate = nn.Linear(width, experts)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x):
        logits = self.gate(x)
        choice = logits.argmax(-1)
        weight = logits.softmax(-1).gather(-1, choice[:, None])  # the gate trains through its chosen probability
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            idx = (choice == e).nonzero(as_tuple=True)[0]
            out = out.index_add(0, idx, expert(x[idx]) * weight[idx])
        return x + out


def build(width: int = 12):
    """``Linear -> Router -> Linear``, ``[batch, width]`` in and out."""
    return nn.Sequential(nn.Linear(width, width), Router(width), nn.Linear(width, width))
