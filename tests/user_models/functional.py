"""A training step through ``torch.func.functional_call`` (weight noise, MAML, functional SAM and per-sample
gradients train this way): the model runs with its parameters swapped for computed tensors. None imports
reportgen."""

import torch

from user_models.faults import mse


def noisy_weights(model, batch):
    """One step on weights ``p + 0 * noise`` (a weight-noise step at zero scale, so both twins train alike): the
    forward runs through ``functional_call`` on tensors that are not leaves; their gradients reach ``p``."""
    x, y = batch
    params = {name: p + 0.0 * torch.randn_like(p) for name, p in model.named_parameters()}
    loss = mse(torch.func.functional_call(model, params, (x,)), y)
    loss.backward()
    return loss.detach()
