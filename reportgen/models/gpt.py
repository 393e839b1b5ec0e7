"""A small decoder-only transformer (pre-norm, causal self-attention, dropout), nanoGPT-style."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, ``[batch, seq, width]`` in and out.

    Uses ``F.scaled_dot_product_attention(is_causal=True)``; attention dropout only in training.
    """

    def __init__(self, width: int, heads: int, p: float):
        super().__init__()
        if width % heads:
            raise ValueError(f"width={width} must be a multiple of heads={heads}")
        self.heads, self.p = heads, p
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + attn(LN(x))`` then ``x + MLP(LN(x))``, ``[batch, seq, width]``."""

    def __init__(self, width: int, heads: int, p: float):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(width), CausalSelfAttention(width, heads, p)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Character-level language model: ids ``[batch, seq]`` → logits ``[batch, seq, vocab]``.

    Args:
        vocab_size: distinct characters (taken from the task when built by reportgen).
        block_size: longest sequence (learned positional embedding rows).
        width: residual stream features (``h`` in Korthikanti et al. 2022).
        depth: number of :class:`TransformerBlock`.
        heads: attention heads (``a``).
        p: dropout probability.
    """

    def __init__(
        self, vocab_size: int, block_size: int = 64, width: int = 128, depth: int = 4, heads: int = 4, p: float = 0.1
    ):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, width), nn.Embedding(block_size, width)
        self.drop = nn.Dropout(p)
        self.blocks = nn.Sequential(*[TransformerBlock(width, heads, p) for _ in range(depth)])
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.head(self.ln_f(self.blocks(self.drop(self.tok(ids) + self.pos(pos)))))


def build(task=None, vocab_size: int | None = None, **kwargs) -> GPT:
    """Build :class:`GPT`, sizing the vocabulary and context from ``task`` when given.

    Raises:
        ValueError: neither ``task`` nor ``vocab_size`` is given.
    """
    if vocab_size is None:
        if task is None:
            raise ValueError("gpt.build needs task= or vocab_size=")
        vocab_size = task.vocab_size
    if task is not None:
        kwargs.setdefault("block_size", task.block_size)
    return GPT(vocab_size, **kwargs)
