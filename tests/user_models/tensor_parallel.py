"""A sequence model trained with tensor and sequence parallelism inside FSDP2, as torchtitan lays out a Llama
block (torchtitan/models/llama3/parallelize.py), at a size 4 CPU ranks (gloo, a ``dp_shard:2,tp:2`` mesh) run in
seconds. Batches are ``[batch, seq, 8]`` inputs with zero targets, MSE."""

from __future__ import annotations

import torch
from torch import nn


class SeqBlock(nn.Module):
    """Pre-norm residual MLP over ``[batch, seq, width]``: ``x + Dropout(down(GELU(up(LayerNorm(x)))))``."""

    def __init__(self, width: int = 8, hidden: int = 16, p: float = 0.1):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.down(nn.functional.gelu(self.up(self.norm(x)))))


class SeqNet(nn.Module):
    """``[batch, seq, width]`` → same shape: an input layer, :class:`SeqBlock` s, a final norm and a head."""

    def __init__(self, width: int = 8, depth: int = 2, p: float = 0.1):
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.blocks = nn.Sequential(*[SeqBlock(width, 2 * width, p) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(x))))


def build_seq(width: int = 8, depth: int = 2, p: float = 0.1) -> nn.Module:
    """:class:`SeqNet` (dropout ``p``); recompute targets ``[SeqBlock]``."""
    return SeqNet(width, depth, p)


def batch_seq(generator: torch.Generator, batch_size: int = 4, seq: int = 4, width: int = 8):
    """``([batch, seq, width]`` normal inputs, zero targets of the same shape)."""
    x = torch.randn(batch_size, seq, width, generator=generator)
    return x, torch.zeros_like(x)


def wrap_sequence_parallel(model: nn.Module, mesh) -> nn.Module:
    """A user's ``distributed.wrap`` on a ``dp_shard × tp`` mesh, torchtitan's way: inside each block the norm
    runs sequence parallel (``Shard(1)``: each TP rank normalises its part of the sequence), ``up`` column- and
    ``down`` row-parallel (its output reduce-scattered back to sequence shards); the blocks get the sequence
    split from the replicated input, the final norm is sequence parallel and the head gathers it. Then FSDP2
    over ``mesh["dp_shard"]``, each block (or its recompute wrapper) a unit, then the root."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = mesh["tp"]
    for module in model.modules():
        if isinstance(module, SeqBlock):
            plan = {
                "norm": SequenceParallel(),
                "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1)),
            }
            parallelize_module(module, tp, plan)
    split = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True)
    outer = {
        "blocks": split,
        "norm": SequenceParallel(),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    parallelize_module(model, tp, outer)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp_shard"])
    return fully_shard(model, mesh=mesh["dp_shard"])


def wrap_tensor_parallel_only(model: nn.Module, mesh) -> nn.Module:
    """A user's ``distributed.wrap`` on a ``dp_replicate × tp`` mesh that forgets the data-parallel dimension: the
    built-in mlp's blocks column/row parallel on ``mesh["tp"]``, nothing reduces gradients over
    ``mesh["dp_replicate"]`` (no DDP, no ``replicate``), so the two replicas step with their own gradients."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from reportgen.models.mlp import ResidualMLPBlock

    for module in model.modules():
        if isinstance(module, ResidualMLPBlock):
            parallelize_module(module, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model
