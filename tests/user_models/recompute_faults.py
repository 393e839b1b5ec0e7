"""Models whose recomputation goes wrong in ways with a cause of their own (issue 16, items 3 and 5).

Each is what a user would point reportgen at with ``_target_`` (configs in tests/user_conf/model);
none imports reportgen. Written from scratch: a tiny key/value cache, a custom autograd Function,
a tensor cached on a shared object, ``retain_grad`` inside a layer, a layer that returns its own
parameter.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

WIDTH, VOCAB, SEQ = 16, 32, 6


def token_batch(generator, batch_size=4):
    """``(input_ids [batch, SEQ] int64, next-token targets [batch, SEQ] int64)``."""
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def logits_loss(output, target):
    """Cross-entropy of ``output["logits"]`` (or ``output`` itself) [batch, seq, VOCAB] vs ``target``."""
    logits = output["logits"] if isinstance(output, dict) else output
    return nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())


def dense_batch(generator, batch_size=4):
    """``(x [batch, WIDTH], zeros [batch, WIDTH])``."""
    x = torch.randn(batch_size, WIDTH, generator=generator)
    return x, torch.zeros_like(x)


def mse(output, target):
    """Mean squared error, scalar."""
    return (output - target).square().mean()


# --- a decoder whose layers append to a key/value cache (use_cache=True) -------------------------
class TinyCache:
    """A key/value cache like transformers 4.x's ``DynamicCache``: per layer, keys and values
    ``[batch, seq_so_far, WIDTH]``; :meth:`update` appends and returns everything cached so far."""

    def __init__(self):
        self.key_cache: list[torch.Tensor] = []
        self.value_cache: list[torch.Tensor] = []

    def update(self, k, v, layer: int):
        """Append ``k``, ``v`` [batch, seq, WIDTH] to ``layer``'s entries; return all of them."""
        if len(self.key_cache) <= layer:
            self.key_cache.append(k)
            self.value_cache.append(v)
        else:
            self.key_cache[layer] = torch.cat([self.key_cache[layer], k], dim=1)
            self.value_cache[layer] = torch.cat([self.value_cache[layer], v], dim=1)
        return self.key_cache[layer], self.value_cache[layer]


class CachedAttentionLayer(nn.Module):
    """One causal attention layer plus MLP that writes its keys/values into the cache it is given.

    Queries are the newest positions: query ``i`` sees every cached key up to its own position
    (keys ``[0, cached - seq + i]``), as a decoder generating after a prompt does.
    """

    def __init__(self, index: int):
        super().__init__()
        self.index = index
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(), nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, h, cache=None):  # h: [batch, seq, WIDTH]
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        if cache is not None:
            k, v = cache.update(k, v, self.index)
        seq, keys = h.shape[1], k.shape[1]
        mask = torch.ones(seq, keys, dtype=torch.bool).tril(diagonal=keys - seq)
        scores = (q @ k.transpose(1, 2) / math.sqrt(WIDTH)).masked_fill(~mask, float("-inf"))
        h = h + scores.softmax(-1) @ v
        return h + self.mlp(h)


class CachedDecoder(nn.Module):
    """Embedding, two :class:`CachedAttentionLayer` s, head; returns ``{"logits", "past_key_values"}``.

    ``config.use_cache`` (default True, as in Hugging Face configs) decides whether the layers get
    a :class:`TinyCache`; ``forward(use_cache=False)`` turns it off for one call.
    """

    def __init__(self, use_cache: bool = True):
        super().__init__()
        self.config = SimpleNamespace(use_cache=use_cache)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(CachedAttentionLayer(i) for i in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, input_ids, use_cache=None):  # [batch, seq] -> logits [batch, seq, VOCAB]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = TinyCache() if use_cache else None
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, cache)
        return {"logits": self.head(h), "past_key_values": cache}


def build_cached_decoder(use_cache: bool = True):
    """A :class:`CachedDecoder` (recompute its ``CachedAttentionLayer`` s)."""
    return CachedDecoder(use_cache)


# --- a custom autograd Function that reads ctx.saved_tensors twice -----------------------------
class ScaleTwiceRead(torch.autograd.Function):
    """``x * w`` whose backward reads ``ctx.saved_tensors`` twice (fine without recompute)."""

    @staticmethod
    def forward(ctx, x, w):  # x: [batch, WIDTH], w: [WIDTH]
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, grad):
        _, w = ctx.saved_tensors
        x, _ = ctx.saved_tensors  # the second read
        return grad * w, (grad * x).sum(0)


class ScaledBlock(nn.Module):
    """``ScaleTwiceRead(tanh(Linear(x)), w)``, ``[batch, WIDTH]``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, WIDTH))

    def forward(self, x):
        return ScaleTwiceRead.apply(torch.tanh(self.lin(x)), self.w)


def build_saved_twice():
    """A stem ``Linear`` (so each block's input requires grad), then two :class:`ScaledBlock` s."""
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), ScaledBlock(), ScaledBlock())


# --- a graph tensor cached on a shared object and read by several regions ----------------------
class SharedTable:
    """An object the layers share: holds ``value``, a tensor computed once per forward."""

    value: torch.Tensor | None = None


class TableReader(nn.Module):
    """``x + tanh(Linear(x)) * table.value``: reads the shared tensor, not an argument."""

    def __init__(self, table: SharedTable):
        super().__init__()
        self.table = table
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):  # [batch, WIDTH]
        return x + torch.tanh(self.lin(x)) * self.table.value


class SharedTableNet(nn.Module):
    """Computes ``table.value = Linear(pos)`` (in the graph) once per forward; three readers use it."""

    def __init__(self):
        super().__init__()
        self.table = SharedTable()
        self.stem = nn.Linear(WIDTH, WIDTH)  # so each reader's input requires grad
        self.pos = nn.Parameter(torch.linspace(-1, 1, WIDTH))
        self.pos_proj = nn.Linear(WIDTH, WIDTH)
        self.readers = nn.ModuleList(TableReader(self.table) for _ in range(3))

    def forward(self, x):
        self.table.value = self.pos_proj(self.pos)  # [WIDTH], requires grad
        x = self.stem(x)
        for reader in self.readers:
            x = reader(x)
        return x


def build_shared_table():
    """A :class:`SharedTableNet` (recompute its ``TableReader`` s)."""
    return SharedTableNet()


# --- retain_grad() inside a layer, the retained tensor kept on the module ------------------------
class RetainingBlock(nn.Module):
    """``relu(Linear(x))`` that keeps its pre-activation with ``retain_grad()`` for inspection."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.pre = None

    def forward(self, x):
        pre = self.lin(x)
        if pre.requires_grad:  # not in evaluation (no_grad)
            pre.retain_grad()
            self.pre = pre  # read after backward: self.pre.grad
        return torch.relu(pre)


def build_retain_grad():
    """A stem ``Linear`` (so each block's input requires grad), then two :class:`RetainingBlock` s."""
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), RetainingBlock(), RetainingBlock())


# --- a layer that returns a tensor it did not create (its own parameter) -------------------------
class Bias(nn.Module):
    """Returns its own parameter ``bias`` [WIDTH], ignoring the input (a learned constant)."""

    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.linspace(-0.5, 0.5, WIDTH))

    def forward(self, x):
        return self.bias


class BiasNet(nn.Module):
    """``h + Bias()(h)`` with ``h = Linear(x)``, ``[batch, WIDTH]`` (the region's input requires grad)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)
        self.bias = Bias()

    def forward(self, x):
        h = self.lin(x)
        return h + self.bias(h)


def build_returns_parameter():
    """A :class:`BiasNet` (recompute its ``Bias``: under reentrant recompute backward would recurse)."""
    return BiasNet()


# --- a layer that returns a graph tensor kept on a shared object (not a parameter) ---------------
class TableValue(nn.Module):
    """Returns ``table.value`` itself (a tensor of the graph computed outside it), ignoring the input."""

    def __init__(self, table: SharedTable):
        super().__init__()
        self.table = table

    def forward(self, x):
        return self.table.value


class TableValueNet(nn.Module):
    """``h + TableValue()(h)`` with ``h = Linear(x)`` and ``table.value = Linear(pos)`` set each forward."""

    def __init__(self):
        super().__init__()
        self.table = SharedTable()
        self.pos = nn.Parameter(torch.linspace(-1, 1, WIDTH))
        self.pos_proj = nn.Linear(WIDTH, WIDTH)
        self.stem = nn.Linear(WIDTH, WIDTH)
        self.value = TableValue(self.table)

    def forward(self, x):
        self.table.value = self.pos_proj(self.pos)  # [WIDTH], requires grad
        h = self.stem(x)
        return h + self.value(h)


def build_returns_table_value():
    """A :class:`TableValueNet` (recompute its ``TableValue``: under reentrant recompute backward would recurse)."""
    return TableValueNet()


# --- a layer whose forward registers a gradient hook unconditionally (issue 28 item 6) -------------
class HookingBlock(nn.Module):
    """``relu(Linear(x))`` that registers a hook on its pre-activation in every forward, even where the
    pre-activation does not require grad: evaluation under ``torch.no_grad`` raises in either twin
    (the baseline cannot be evaluated), and reentrant recompute's no-grad forward raises too."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        pre = self.lin(x)
        pre.register_hook(self._count)  # RuntimeError when pre does not require grad
        return torch.relu(pre)

    def _count(self, grad):
        return grad


def build_hooking():
    """A stem ``Linear`` (so each block's input requires grad), then two :class:`HookingBlock` s."""
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), HookingBlock(), HookingBlock())
