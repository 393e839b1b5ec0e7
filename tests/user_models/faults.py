"""Small models on which activation recomputation goes wrong (or saves less than it seems).

Each ``build_*`` / ``batch_*`` / ``loss_*`` trio is what a user would point reportgen at
with ``_target_`` and ``reportgen.tasks.FunctionTask``; none imports reportgen.
"""

import torch
from torch import nn


def mse(output, target):
    """Mean squared error, scalar."""
    return (output - target).square().mean()


def xent(output, target):
    """Cross-entropy over the last dim of ``output`` ([..., classes]) against int targets."""
    return nn.functional.cross_entropy(output.flatten(0, -2), target.flatten())


# --- dropout inside the recomputed block (preserve_rng_state matters) -----------------------
class DropoutFFN(nn.Module):
    """``x + Linear(Dropout(GELU(Linear(x))))``, ``[batch, 24]``."""

    def __init__(self, width: int = 24, p: float = 0.5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Dropout(p), nn.Linear(4 * width, width))

    def forward(self, x):
        return x + self.net(x)


def build_dropout():
    return nn.Sequential(DropoutFFN(), DropoutFFN())


def batch_dense(generator, batch_size=8, width=24):
    x = torch.randn(batch_size, width, generator=generator)
    return x, torch.zeros_like(x)


# --- BatchNorm inside the recomputed block (running stats advance twice) -------------------
class BNBlock(nn.Module):
    def __init__(self, channels: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):  # [batch, channels, h, w]
        return x + torch.relu(self.bn(self.conv(x)))


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, padding=1)
        self.blocks = nn.Sequential(BNBlock(), BNBlock())
        self.head = nn.Linear(4, 5)

    def forward(self, x):  # [batch, 1, 6, 6] -> [batch, 5]
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def build_bn():
    return BNNet()


def batch_image(generator, batch_size=8):
    return torch.randn(batch_size, 1, 6, 6, generator=generator), torch.randint(
        0, 5, (batch_size,), generator=generator
    )


# --- frozen embedding feeding recomputed blocks (reentrant loses the gradients) -------------
class Adapter(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, h):  # [batch, seq, width]
        return h + torch.tanh(self.proj(h))


class FrozenEmbedNet(nn.Module):
    def __init__(self, vocab: int = 20, width: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.embed.weight.requires_grad_(False)
        self.adapters = nn.Sequential(Adapter(width), Adapter(width))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):  # [batch, seq] -> [batch, seq, vocab]
        return self.head(self.adapters(self.embed(ids)))


def build_frozen():
    return FrozenEmbedNet()


def batch_ids(generator, batch_size=4, seq=6, vocab=20):
    ids = torch.randint(0, vocab, (batch_size, seq), generator=generator)
    return ids, torch.roll(ids, -1, dims=1)


# --- forward increments a Python counter it also reads --------------------------------------
class Counter(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.steps = 0

    def forward(self, x):
        self.steps += 1
        return torch.tanh(self.lin(x)) * (1.0 + 0.5 * self.steps)


def build_counter():
    return nn.Sequential(Counter(), Counter())


def batch_small(generator, batch_size=4):
    return batch_dense(generator, batch_size, width=8)


# --- granularity: whole layer vs each child --------------------------------------------------
class Mix(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):  # [batch, seq, width]
        return self.lin(torch.cumsum(x, dim=1) / x.shape[1])


class Feed(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Layer(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.norm1, self.mix = nn.LayerNorm(width), Mix(width)
        self.norm2, self.feed = nn.LayerNorm(width), Feed(width)

    def forward(self, x):
        x = x + self.mix(self.norm1(x))
        return x + self.feed(self.norm2(x))


def build_layers(depth: int = 3):
    return nn.Sequential(*[Layer() for _ in range(depth)])


def batch_seq(generator, batch_size=2, seq=32, width=16):
    x = torch.randn(batch_size, seq, width, generator=generator)
    return x, torch.zeros_like(x)


# --- a forward whose recomputation differs in shape: torch raises CheckpointError -------------
class ShapeShifter(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x):  # second call (the recomputation) drops one row
        self.calls += 1
        return torch.tanh(self.lin(x if self.calls % 2 else x[:-1]))


def build_shape_shifter():
    return nn.Sequential(nn.Linear(8, 8), ShapeShifter())


def loss_sum(output, target):
    return output.sum()


# --- a model whose plain forward raises: the claim cannot be tested ---------------------------
class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        raise RuntimeError("plain forward is broken")


def build_broken():
    return nn.Sequential(Broken())
