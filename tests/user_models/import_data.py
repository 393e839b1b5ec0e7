"""The tutorial's ffn fed data read with ``np.load`` when this module is imported, from the file
``$REPORTGEN_TEST_IMPORT_DATA`` names: no config value names it and training opens nothing, so
neither the cache key nor the files opened while training see an edit of it (issue 36)."""

import os

import numpy as np
import torch
from torch import nn

from reportgen.models.ffn import build as ffn

DATA = np.load(os.environ["REPORTGEN_TEST_IMPORT_DATA"])  # float32 [12]


class Offset(nn.Module):
    """``x + DATA``, ``[batch, 12] -> [batch, 12]`` (the data as a buffer)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("data", torch.from_numpy(DATA.copy()))

    def forward(self, x):
        return x + self.data


def build():
    """The data offset, then the tutorial's block (the recompute target)."""
    return nn.Sequential(Offset(), *ffn())
