"""The causal LM a config describes, at any depth, on fake or real tensors, and its batch and loss.

The plan never builds every decoder layer: :func:`layer_kinds` sorts the layers into kinds (the
config's per-layer lists, e.g. ``layer_types`` sliding/full attention, and ``mlp_only_layers``
dense/MoE), and :func:`shallow_config` gives the same config with only chosen layers, so one
traced layer of each kind stands for all of them (:mod:`reportgen.plan.trace`).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from reportgen.models.hf.auto import auto_model

#: Config keys that place layers of another kind by index in ways :func:`shallow_config` cannot
#: renumber; a config with one of them set is traced at full depth (slower, still exact).
INDEX_KEYS = ("first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step")
#: What to give when transformers has no causal LM for the config (:func:`build_causal_lm`).
SCOPE = "give a decoder-only config that AutoModelForCausalLM builds (e.g. model_type llama, qwen2)"


def layer_count(config: Any) -> int:
    """Decoder layers of the config (``num_hidden_layers``)."""
    return int(getattr(config, "num_hidden_layers", 0) or 0)


def _per_layer_lists(config: Any) -> dict[str, list | tuple]:
    """The config's attributes that hold one value per layer (``layer_types`` ...)."""
    n = layer_count(config)
    return {k: v for k, v in vars(config).items() if isinstance(v, (list, tuple)) and len(v) == n and n > 1}


def renumbers(config: Any) -> bool:
    """True when :func:`shallow_config` keeps every layer's kind (no :data:`INDEX_KEYS` in effect)."""
    return all(getattr(config, key, None) in (None, 0, 1) for key in INDEX_KEYS)


def layer_kinds(config: Any) -> list[tuple]:
    """One hashable kind per decoder layer, bottom first: its values in the config's per-layer
    lists (e.g. ``("sliding_attention",)``) and whether it is listed in ``mlp_only_layers``."""
    lists = _per_layer_lists(config)
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    return [tuple(str(v[i]) for v in lists.values()) + ((i in dense),) for i in range(layer_count(config))]


def shallow_config(config: Any, indices: list[int]) -> Any:
    """A copy of ``config`` with only the layers ``indices`` (bottom first), per-layer lists and
    ``mlp_only_layers`` renumbered; everything else (widths, vocabulary) unchanged."""
    small = copy.deepcopy(config)
    for key, values in _per_layer_lists(config).items():
        setattr(small, key, type(values)(values[i] for i in indices))
    if getattr(config, "mlp_only_layers", None):
        small.mlp_only_layers = [j for j, i in enumerate(indices) if i in set(config.mlp_only_layers)]
    small.num_hidden_layers = len(indices)
    return small


def build_causal_lm(config: Any, dtype: torch.dtype, attn: str) -> nn.Module:
    """:func:`reportgen.models.hf.auto.auto_model` (``AutoModelForCausalLM``) in ``dtype`` with ``attn``, in
    train mode: inside a ``FakeTensorMode`` for the plan, outside for a real model (the tests)."""
    return auto_model(config, scope=SCOPE, attn=attn, dtype=dtype).train()


def decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of the decoder layers, in order: the children of the model's ``layers`` /
    ``h`` ``ModuleList`` (``model.layers.0`` ...)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h") and len(module):
            return [(f"{name}.{i}", layer) for i, layer in enumerate(module)]
    return []


def causal_lm_loss(output: Any, target: Tensor) -> Tensor:
    """Mean cross-entropy of ``output.logits`` ``[b, s, vocab]`` upcast to float32 against next-token
    ids ``[b, s]`` (the loss of :class:`reportgen.models.hf.CausalLMTask` and of torchtitan)."""
    return F.cross_entropy(output.logits.flatten(0, 1).float(), target.flatten())


def real_batch(batch: int, seq: int) -> tuple[dict[str, Tensor], Tensor]:
    """A packed batch on real tensors: ``({"input_ids": [b, s] int64 zeros, "attention_mask": [b, s]
    bool ones}, targets [b, s] int64 zeros)``."""
    ids = torch.zeros(batch, seq, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.bool)}, torch.zeros_like(ids)


@contextlib.contextmanager
def mask_constants(numel: int):
    """Let fake tensors of up to ``numel`` elements carry their values while inside.

    ``FakeTensorMode`` keeps the values of a fake tensor (a *constant*) only up to
    ``torch._subclasses.fake_tensor.CONSTANT_NUMEL_LIMIT`` elements (1). Only the attention mask
    is made a constant (:func:`fake_batch`), so transformers' ``padding_mask.all()`` reads True as on
    real tensors (sdpa with ``is_causal``, no ``s x s`` mask); no other tensor gets values.
    """
    from torch._subclasses import fake_tensor

    previous = fake_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = max(previous, numel)
    try:  # imported now: the model's module imports it only once the model is built, inside this context
        masking = importlib.import_module("transformers.masking_utils")
    except ImportError:
        masking = None
    is_tracing = getattr(masking, "is_tracing", None)  # transformers 5: a fake tensor counts as tracing,
    if is_tracing is not None:  # so it would keep a mask the real run skips; judge it as the real run does
        setattr(  # noqa: B010 - a module attribute transformers defines, set for the trace only
            masking,
            "is_tracing",
            lambda tensor=None: (
                is_tracing(None) or (tensor is not None and not fake_tensor.is_fake(tensor) and is_tracing(tensor))
            ),
        )
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = previous
        if is_tracing is not None:
            setattr(masking, "is_tracing", is_tracing)  # noqa: B010 - put back


def fake_batch(mode: Any, batch: int, seq: int) -> tuple[dict[str, Tensor], Tensor]:
    """:func:`real_batch` on fake tensors of ``mode`` (call it inside the mode): the ids and targets are
    born fake (no host memory, whatever the shape); the mask is made real, one byte per token, and
    carries its values (use it inside :func:`mask_constants`)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        mask = torch.ones(batch, seq, dtype=torch.bool)
    ids = torch.zeros(batch, seq, dtype=torch.long)
    inputs = {"input_ids": ids, "attention_mask": mode.fake_tensor_converter.from_real_tensor(mode, mask, True)}
    return inputs, torch.zeros_like(ids)


def layer_prefix(config: Any, dtype: torch.dtype, attn: str) -> str:
    """The decoder layers' path without the index (``model.layers``, ``transformer.h``), read from a
    one-layer copy of the model built on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        layers = decoder_layers(build_causal_lm(shallow_config(config, [0]), dtype, attn))
    return layers[0][0].rsplit(".", 1)[0] if layers else "model.layers"
