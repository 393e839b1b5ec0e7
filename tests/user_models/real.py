"""User models shaped like released ones (issue 9): structured outputs, a model's own recompute
switch, base-class targets, a factory that already recomputes, and a region whose autocast
state changes between forward and recompute. Imports nothing from reportgen."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

VOCAB, WIDTH, SEQ = 40, 16, 8


@dataclass
class LMOutput:
    """A ``ModelOutput``-like dataclass: logits ``[b, s, vocab]`` and the hidden states per layer."""

    logits: torch.Tensor
    hidden_states: tuple


class DecoderLayerBase(nn.Module):
    """A shared base class, as model libraries have ("decoder layer"); targets may name it."""


class DecoderLayer(DecoderLayerBase):
    """Pre-norm MLP block ``h + FF(LN(h))`` on ``[b, s, width]``; recomputes itself when its
    model's switch is on (``self.gradient_checkpointing``), the way Hugging Face layers do."""

    def __init__(self, width=WIDTH):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * width, width))
        self.gradient_checkpointing = False
        self.use_reentrant = False

    def _forward(self, h, mask):
        return h + self.ff(self.norm(h)) * mask.unsqueeze(-1)

    def forward(self, h, mask):
        if self.gradient_checkpointing and self.training:
            return checkpoint(self._forward, h, mask, use_reentrant=self.use_reentrant)
        return self._forward(h, mask)


class TinyDecoder(nn.Module):
    """``model(input_ids=[b, s], attention_mask=[b, s]) -> LMOutput``."""

    def __init__(self, depth=2, switch_on=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList([DecoderLayer() for _ in range(depth)])
        self.head = nn.Linear(WIDTH, VOCAB)
        if switch_on:
            self.gradient_checkpointing_enable()

    def gradient_checkpointing_enable(self, use_reentrant: bool = False):
        """The model's own switch: every layer recomputes itself."""
        for layer in self.layers:
            layer.gradient_checkpointing, layer.use_reentrant = True, use_reentrant

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids)
        mask = attention_mask.to(h.dtype)
        hidden = []
        for layer in self.layers:
            h = layer(h, mask)
            hidden.append(h)
        return LMOutput(self.head(h), tuple(hidden))


def build_decoder(depth=2):
    return TinyDecoder(depth)


def build_already_recomputing(depth=2):
    """A factory that turns recomputation on itself: the 'plain' twin is not plain."""
    return TinyDecoder(depth, switch_on=True)


def enable(model, recompute_cfg):
    """A user's switch for ``recompute.method=model_switch``."""
    mode = getattr(recompute_cfg.mode, "value", recompute_cfg.mode)
    model.gradient_checkpointing_enable(use_reentrant=mode == "reentrant")


def make_batch(generator, batch_size=4):
    """``({"input_ids", "attention_mask"} [b, s] int64, next-token targets [b, s])``."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ), generator=generator)
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask}, torch.roll(ids, -1, dims=1)


def lm_loss(output, target):
    """Cross-entropy of ``output.logits`` against next tokens."""
    return F.cross_entropy(output.logits.flatten(0, 1).float(), target.flatten())


class FlipAutocast(nn.Module):
    """Runs its inner linear under autocast on every other call only: the recomputation (a
    second call) runs in another precision than the forward did."""

    def __init__(self, width=WIDTH):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.calls % 2 == 1):
            return self.lin(x).float()


def build_flip():
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), FlipAutocast(), nn.Linear(WIDTH, WIDTH))


def dense_batch(generator, batch_size=4):
    x = torch.randn(batch_size, WIDTH, generator=generator)
    return x, torch.zeros_like(x)


def mse(output, target):
    return (output.float() - target).square().mean()


class LoRALinear(nn.Module):
    """A frozen base ``Linear`` plus a trainable low-rank adapter (``B @ A``, rank 2), as PEFT's LoRA."""

    def __init__(self, base: nn.Linear, rank: int = 2):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.lora_B = nn.Parameter(torch.randn(base.out_features, rank) * 0.1)

    def forward(self, x):
        return self.base(x) + x @ self.lora_A.T @ self.lora_B.T


def build_lora_decoder(depth=2, trainable_head=True):
    """LoRA adapters on every layer's linears of a frozen decoder (and, as PEFT's
    ``modules_to_save=["lm_head"]``, a trainable head): the layers' inputs come from the frozen
    embedding and do not require grad."""
    model = TinyDecoder(depth).requires_grad_(False)
    model.head.requires_grad_(trainable_head)
    for layer in model.layers:
        layer.ff[0], layer.ff[3] = LoRALinear(layer.ff[0]), LoRALinear(layer.ff[3])
    return model
