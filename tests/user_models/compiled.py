"""A healthy model that calls a ``torch.compile(fullgraph=True)`` function inside its recomputed blocks
(issue 36, item 6). None imports reportgen."""

import torch
from torch import nn


@torch.compile(fullgraph=True, backend="eager")  # eager: compiled by dynamo, no C++ toolchain needed
def scaled_gelu(x):
    """``2 * gelu(x)``, traced whole by dynamo."""
    return 2.0 * torch.nn.functional.gelu(x)


class CompiledBlock(nn.Module):
    """``x + lin(scaled_gelu(x))`` on ``[batch, width]``."""

    def __init__(self, width: int = 12):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return x + self.lin(scaled_gelu(x))


def build(width: int = 12, depth: int = 2):
    """``depth`` compiled blocks and a head."""
    return nn.Sequential(*[CompiledBlock(width) for _ in range(depth)], nn.Linear(width, width))
