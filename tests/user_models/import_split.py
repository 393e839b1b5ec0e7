"""A task whose training pool and validation split are read with ``np.load`` when this module is
imported, from the ``.npz`` file ``$REPORTGEN_TEST_IMPORT_SPLIT`` names (``train`` float32 [64, 12],
``val`` float32 [16, 12]): no config value names it and training opens nothing, so neither the cache
key nor the files opened while training see an edit of it (issue 44)."""

import os

import numpy as np
import torch

SPLIT = np.load(os.environ["REPORTGEN_TEST_IMPORT_SPLIT"])
TRAIN, VAL = torch.from_numpy(SPLIT["train"].copy()), torch.from_numpy(SPLIT["val"].copy())


class SplitTask:
    """Loss = mean of squared outputs; training batches are rows of ``TRAIN`` drawn with the run's
    generator, the held-out loss is on ``VAL``."""

    metric = "loss"
    higher_is_better = False

    def make_batch(self, generator, batch_size):
        """``([batch, 12] rows of TRAIN, zeros [batch, 12])``, rows drawn with ``generator``."""
        rows = torch.randint(0, len(TRAIN), (batch_size,), generator=generator)
        return TRAIN[rows].clone(), torch.zeros(batch_size, TRAIN.shape[1])

    def loss(self, output, target):
        """Mean of squared outputs (the target is unused)."""
        return output.square().mean()

    def evaluate(self, model):
        """``{"loss": mean squared output on VAL}``."""
        parameter = next(model.parameters())
        return {"loss": float(model(VAL.to(parameter.device, parameter.dtype)).square().mean())}
