"""A Llama-shaped decoder (RMSNorm, rotary attention, SwiGLU) a factory may build on the meta device, as
torchtitan builds its models (``with torch.device("meta")``, then ``to_empty`` + :meth:`MetaLlama.init_weights`
after sharding). Sizes: ``params ≈ vocab·dim·2 + layers·(4·dim² + 3·dim·hidden)``; with the defaults of
:data:`SIZES` ``"100m"`` about 101M parameters, ``"25m"`` about 25M, ``"tiny"`` about 0.1M."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: Vocabulary and tokens per example of :func:`batch_tokens` (the model is built for the same).
VOCAB, SEQ = 512, 16

#: Named shapes ``(dim, layers, heads, hidden)``.
SIZES = {
    "tiny": (32, 2, 4, 64),
    "25m": (512, 8, 8, 1376),
    "100m": (1024, 8, 16, 2752),
}


def rotary(seq: int, head_dim: int) -> torch.Tensor:
    """``[seq, head_dim // 2, 2]`` cos/sin of the rotary angles (RoFormer, theta 10000)."""
    freqs = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq).float(), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1)


def rotate(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """``x`` ``[batch, heads, seq, head_dim]`` rotated pairwise by ``rope`` (:func:`rotary`)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = rope[..., 0], rope[..., 1]
    out = torch.stack([pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 0] * sin + pairs[..., 1] * cos], -1)
    return out.flatten(-2).type_as(x)


class Block(nn.Module):
    """One pre-norm decoder block: ``x + attn(norm(x))``, then ``+ swiglu(norm(x))``; ``[batch, seq, dim]``."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(rotate(q, rope), rotate(k, rope), v, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(b, s, d))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    def init_weights(self, std: float) -> None:
        """Normal(0, 0.02) inputs, ``std`` outputs (torchtitan's depth-scaled init); norms to one."""
        for norm in (self.attn_norm, self.ffn_norm):
            norm.reset_parameters()
        for lin in (self.wqkv, self.w1, self.w3):
            nn.init.trunc_normal_(lin.weight, std=0.02)
        for lin in (self.wo, self.w2):
            nn.init.trunc_normal_(lin.weight, std=std)


class MetaLlama(nn.Module):
    """``ids [batch, seq]`` → logits ``[batch, seq, vocab]``; ``rope`` a non-persistent buffer that
    :meth:`init_weights` computes (a meta build holds none)."""

    def __init__(self, dim: int, layers: int, heads: int, hidden: int, vocab: int = VOCAB, seq: int = SEQ):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.register_buffer("rope", rotary(seq, dim // heads), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, self.rope[: ids.shape[1]])
        return self.head(self.norm(x))

    def init_weights(self) -> None:
        """Every parameter and buffer, from torch's generators (run under a fixed seed by the caller)."""
        with torch.no_grad():
            self.rope.copy_(rotary(self.rope.shape[0], self.rope.shape[1] * 2).to(self.rope.device))
        nn.init.normal_(self.embed.weight)
        std = 0.02 / math.sqrt(2 * len(self.blocks))
        for block in self.blocks:
            block.init_weights(std)
        self.norm.reset_parameters()
        nn.init.trunc_normal_(self.head.weight, std=dim_std(self.head.in_features))


def dim_std(dim: int) -> float:
    """``dim ** -0.5``, the output head's init scale."""
    return dim**-0.5


def build(size: str = "tiny", meta: bool = True) -> MetaLlama:
    """A :class:`MetaLlama` of :data:`SIZES` ``size``, on the meta device when ``meta`` (no storage, no values:
    reportgen materialises it), else initialised on the host."""
    dim, layers, heads, hidden = SIZES[size]
    if not meta:
        model = MetaLlama(dim, layers, heads, hidden)
        model.init_weights()
        return model
    with torch.device("meta"):
        return MetaLlama(dim, layers, heads, hidden)


def batch_tokens(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [batch, SEQ], next ids [batch, SEQ])`` uniform over :data:`VOCAB`."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, nats."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())
