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
import sys
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from reportgen.memory.estimate import default_dtype
from reportgen.plan.args import PlanError

#: Config keys that place layers of another kind by index in ways :func:`shallow_config` cannot
#: renumber; a config with one of them set is traced at full depth (slower, still exact).
INDEX_KEYS = ("first_k_dense_replace", "moe_layer_freq", "decoder_sparse_step")


def layer_count(config: Any) -> int:
    """Decoder layers of the config (``num_hidden_layers``)."""
    return int(getattr(config, "num_hidden_layers", 0) or 0)


def _per_layer_lists(config: Any) -> dict[str, list | tuple]:
    """The config's attributes that hold one value per layer (``layer_types`` ...)."""
    n = layer_count(config)
    return {k: v for k, v in vars(config).items() if isinstance(v, (list, tuple)) and len(v) == n and n > 1}


def renumbers(config: Any) -> bool:
    """True when :func:`shallow_config` keeps every layer's kind (no :data:`INDEX_KEYS` in effect)."""
    for key in INDEX_KEYS:
        value = getattr(config, key, None)
        if value not in (None, 0, 1):
            return False
    return True


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


@contextlib.contextmanager
def without_detection_losses():
    """While inside, transformers reads scipy as absent, if the modeling code is not imported yet.

    ``transformers.modeling_utils`` imports its loss zoo, whose object-detection losses import
    ``scipy.optimize`` (Hungarian matching) when scipy is installed: about 0.4 s of CPU, a tenth of
    the plan's run, for code a causal LM never calls. Those modules then run without it, as on a
    machine without scipy (their loss raises asking for scipy); nothing else reads the flag at
    import. Outside the plan (or once transformers' modeling code is imported) this does nothing.
    """
    if "transformers.modeling_utils" in sys.modules or "scipy.optimize" in sys.modules:
        yield
        return
    import transformers.utils as hf_utils

    found = hf_utils.is_scipy_available
    hf_utils.is_scipy_available = lambda: False
    try:
        yield
    finally:
        hf_utils.is_scipy_available = found


def build_causal_lm(config: Any, dtype: torch.dtype, attn: str) -> nn.Module:
    """``AutoModelForCausalLM.from_config(config, attn_implementation=attn)`` in ``dtype`` on CPU, in
    train mode. Call it inside a ``FakeTensorMode`` for the plan or outside for a real model (the
    tests): parameters are created in ``dtype`` directly (fake ones cannot be converted by ``.to``).

    Raises:
        PlanError: transformers has no causal LM for this config or this attention.
    """
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("cpu"), default_dtype(dtype), without_detection_losses():
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation=attn, dtype=dtype, trust_remote_code=False
            )
    except (ValueError, ImportError, KeyError) as exc:
        reason = " ".join(str(exc).split())[:200]
        about_attention = any(w in reason.lower() for w in ("attention", "sdpa", "attn"))
        hint = (
            "give attn=eager"
            if about_attention and attn != "eager"
            else ("give a decoder-only config that AutoModelForCausalLM builds (e.g. model_type llama, qwen2)")
        )
        raise PlanError(
            f"transformers cannot build a causal LM from this config with attn={attn} ({reason}); {hint}"
        ) from exc
    return model.train()


def decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of the decoder layers, in order: the children of the model's ``layers`` /
    ``h`` ``ModuleList`` (``model.layers.0`` ...)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layers", "h") and len(module):
            return [(f"{name}.{i}", layer) for i, layer in enumerate(module)]
    return []


def causal_lm_loss(output: Any, target: Tensor) -> Tensor:
    """Mean cross-entropy of ``output.logits`` ``[b, s, vocab]`` upcast to float32 against next-token
    ids ``[b, s]`` (the loss of :class:`reportgen.hf.CausalLMTask` and of torchtitan)."""
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
    is_tracing = getattr(masking, "is_tracing", None)  # transformers 5: a fake tensor counts as tracing
    if (
        masking is not None and is_tracing is not None
    ):  # so it would keep a mask the real run skips; judge it as the real run does
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
        if masking is not None and is_tracing is not None:
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
