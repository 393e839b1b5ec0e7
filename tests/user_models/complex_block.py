"""A model with a complex parameter, as spectral and state-space layers hold them: ``w`` ``[width]`` complex64,
used through its real part (a gain) and its imaginary part (a bias scaled by the block's mean activation). With
``imag_fault`` the recomputation reads another mean, which moves only the imaginary part of ``w``'s gradient: a
comparison that reads the real part alone (or a run that casts ``w`` to real) cannot see it. None imports
reportgen."""

import torch
from torch import nn


class ComplexGainBlock(nn.Module):
    """``tanh(lin(x)) * w.real + mean(tanh(lin(x))) * w.imag`` on ``[batch, width]``."""

    def __init__(self, width: int = 12, imag_fault: bool = False):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.w = nn.Parameter(torch.complex(torch.ones(width), torch.full((width,), 0.1)))
        self.imag_fault = imag_fault

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        s = h.mean()
        if self.imag_fault and torch._C._current_graph_task_id() != -1:  # recomputing inside backward
            s = s * 1.5  # saved for w.imag's gradient only
        return h * self.w.real + s * self.w.imag


def build(width: int = 12, imag_fault: bool = False):
    """``Linear -> ComplexGainBlock -> Linear``, ``[batch, width]`` in and out."""
    return nn.Sequential(nn.Linear(width, width), ComplexGainBlock(width, imag_fault), nn.Linear(width, width))
