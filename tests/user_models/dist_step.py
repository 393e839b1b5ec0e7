"""A user's own training step for the sharded tests (issue 23): two forwards before one backward,
gradient accumulation over micro-batches with DDP's ``no_sync`` / FSDP2's gradient-sync switch,
clipping, AdamW and a cosine schedule. Written for these tests; the model is
``user_models.faults.build_dropout`` (dropout inside the recomputed block)."""

from __future__ import annotations

import contextlib

import torch

from user_models.faults import mse

MICRO_BATCHES = 4


def two_forwards(model, batch):
    """A contrastive-style loss: two forwards of the same model, one backward of their sum."""
    x, y = batch
    loss = mse(model(x), y) + mse(model(x.flip(0)), y)
    loss.backward()
    return loss.detach()


def _sync(model, enabled: bool):
    """DDP's ``no_sync()`` while accumulating; FSDP2's ``set_requires_gradient_sync``; nothing otherwise."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    if not enabled and hasattr(model, "no_sync"):
        return model.no_sync()
    return contextlib.nullcontext()


def accumulate(model, batch):
    """Gradient accumulation over :data:`MICRO_BATCHES` micro-batches; gradients are reduced across
    ranks on the last one only. Returns the mean loss."""
    x, y = batch
    total = 0.0
    for index, (xs, ys) in enumerate(zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES))):
        last = index == MICRO_BATCHES - 1
        with _sync(model, last):
            loss = mse(model(xs), ys) / MICRO_BATCHES
            loss.backward()
        total += float(loss.detach())
    return torch.tensor(total)


def clip(model, optimizer):
    """Gradient clipping between backward and the step (norm 0.5; works on DTensor gradients)."""
    del optimizer
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)


def adamw(params):
    """The optimizer the user trains with."""
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)


def cosine(optimizer):
    """A cosine learning-rate schedule over 10 steps."""
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)


def build_after_input(width: int = 24):
    """An input layer, then two ``DropoutFFN`` blocks: the recomputed blocks' inputs require grad, so
    reentrant recompute runs them (a model whose first block reads the raw data would not)."""
    from torch import nn

    from user_models.faults import DropoutFFN

    return nn.Sequential(nn.Linear(width, width), DropoutFFN(width), DropoutFFN(width))
