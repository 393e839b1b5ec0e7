"""A recomputed region fed token ids: an embedding and a small block behind it, ``[batch, seq]`` ids in,
``[batch, seq, width]`` out. A fault that moves floating inputs cannot act on ids; another example's ids can.
None imports reportgen."""

import torch
from torch import nn


class TokenBlock(nn.Module):
    """``tanh(Linear(Embedding(ids)))``: the region, its input token ids ``[batch, seq]``."""

    def __init__(self, vocab: int = 32, width: int = 12):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lin = nn.Linear(width, width)

    def forward(self, ids):
        return torch.tanh(self.lin(self.embed(ids)))


def build(vocab: int = 32, width: int = 12):
    """``TokenBlock -> Linear``."""
    return nn.Sequential(TokenBlock(vocab, width), nn.Linear(width, width))


def batch_ids(generator, batch_size=8, seq=6, vocab=32, width=12):
    """``(ids [batch, seq], target [batch, seq, width])``."""
    ids = torch.randint(0, vocab, (batch_size, seq), generator=generator)
    return ids, torch.randn(batch_size, seq, width, generator=generator)


def mse(output, target):
    """Mean squared error, scalar."""
    return (output - target).square().mean()
