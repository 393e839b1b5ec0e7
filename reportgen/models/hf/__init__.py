"""Hugging Face causal LMs: the model's own recompute switch (:func:`enable`), tiny models from config
objects (:func:`gpt2`, :func:`llama`) and their task (:class:`CausalLMTask`); any model from a local
config.json is :mod:`.auto` (and :mod:`.masked`).

Everything here needs the optional ``hf`` extra (``pip install -e ".[hf]"``, which adds
``transformers``); importing this module does not, so a config that names it without the extra
stops with a usage error (exit 2) that gives the install line instead of an import traceback.

The switch sets two attributes on every module that has a ``gradient_checkpointing`` attribute
(the ``*Model`` body and each decoder layer): ``gradient_checkpointing = True`` and
``_gradient_checkpointing_func`` (a ``functools.partial`` of ``torch.utils.checkpoint.checkpoint``).
transformers 5 also calls ``enable_input_require_grads()`` for models fed ``input_ids`` (a forward
hook on the input embeddings, kept in ``_require_grads_hook``), and it recomputes a layer's
``forward``, not its ``__call__``, so the layer's own hooks do not run again in backward (its
children's do: :func:`reportgen.twins.observe.observe_recompute` counts such a layer as recomputed).
The shipped configs declare the attributes with ``state.ignore_attributes``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from reportgen.errors import SetupError
from reportgen.tasks import CharTextTask
from reportgen.twins.recompute import CheckpointImpl, RecomputeConfigError, checkpoint_kwargs, matches

#: The command that adds the extra; every "transformers is missing" message names it.
INSTALL = 'pip install -e ".[hf]"'


def require_transformers() -> Any:
    """Import ``transformers`` or stop with the install line.

    Returns:
        The ``transformers`` module.

    Raises:
        SetupError: ``transformers`` is not importable (a usage error: the run exits 2).
    """
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise SetupError(
            f"this config needs Hugging Face transformers, which is not installed ({exc}); "
            f"install the hf extra: {INSTALL}"
        ) from exc


def switch(model: nn.Module) -> Callable[..., None]:
    """The model's own recompute switch: ``activation_checkpointing_enable`` where it exists
    (transformers 5, which deprecates the old name), else ``gradient_checkpointing_enable`` (4.x).

    Both take the ``torch.utils.checkpoint.checkpoint`` keywords as their first argument
    (``activation_checkpointing_kwargs`` / ``gradient_checkpointing_kwargs``).

    Raises:
        SetupError: the model has neither switch, or it does not support recomputation.
    """
    found = getattr(model, "activation_checkpointing_enable", None) or getattr(
        model, "gradient_checkpointing_enable", None
    )
    if found is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise SetupError(
            f"recompute.enable=reportgen.models.hf.enable needs a Hugging Face model that supports gradient "
            f"checkpointing; {type(model).__name__} does not. Use recompute.method=wrap with "
            "recompute.targets instead."
        )
    return found


def switched_use_reentrant(model: nn.Module) -> bool | None:
    """The ``use_reentrant`` the switch put in force, read from the ``functools.partial`` of
    ``torch.utils.checkpoint.checkpoint`` it stored on the modules (``_gradient_checkpointing_func``).

    Returns:
        The ``use_reentrant`` keyword; torch's own default (True, with a warning, in torch 2.4–2.13)
        when the partial does not pass it; None when no module holds such a partial.
    """
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if isinstance(func, functools.partial):
            return bool(func.keywords.get("use_reentrant", True))
    return None


def enable(model: nn.Module, rc: Any) -> bool | None:
    """Turn on the model's own recomputation switch (``recompute.method: model_switch``).

    With ``rc.mode`` set, :func:`switch` gets the ``torch.utils.checkpoint.checkpoint`` keywords reportgen's
    own wrapper would use (:func:`reportgen.twins.recompute.checkpoint_kwargs`). With it null
    (``recompute=model_default``, the shipped Hugging Face configs' default) the switch is called with no
    arguments, as most training code does, so the model's default applies (``use_reentrant=True`` in
    transformers 4.x, False in 5.x); it is called again with that mode spelled out only when
    ``preserve_rng_state`` or ``determinism_check`` differ from torch's defaults. Then
    :func:`keep_only_targets` applies ``rc.targets``.

    Args:
        model: a ``transformers.PreTrainedModel``; changed in place (the recompute twin only).
        rc: ``cfg.recompute`` (a structured DictConfig).

    Returns:
        The ``use_reentrant`` value in force (None if the model's partial cannot be read).

    Raises:
        SetupError: see :func:`switch`.
        reportgen.twins.recompute.RecomputeConfigError: bad ``recompute`` settings (e.g. selective
            without ``save_ops``).
    """
    turn_on = switch(model)
    if rc.mode is None:
        turn_on()
        in_force = switched_use_reentrant(model)
        if in_force is None or (rc.preserve_rng_state and (in_force or str(rc.determinism_check) == "default")):
            keep_only_targets(model, list(rc.targets))
            return in_force
        rc = OmegaConf.merge(rc, {"mode": "reentrant" if in_force else "non_reentrant"})
    impl, kwargs = checkpoint_kwargs(rc)
    in_force = impl is CheckpointImpl.REENTRANT
    turn_on({"use_reentrant": in_force, **kwargs})
    keep_only_targets(model, list(rc.targets))
    return in_force


def keep_only_targets(model: nn.Module, targets: list[str]) -> list[str]:
    """With ``recompute.targets`` given to the model's switch: only the layers they match keep
    recomputing (e.g. every k-th decoder layer, ``[model.layers.0, model.layers.2, ...]``); the switch's
    other layers get ``gradient_checkpointing = False`` (transformers' per-layer flag,
    ``GradientCheckpointingLayer``). No targets: every layer the switch turned on keeps it.

    Returns:
        Paths of the layers left recomputing.

    Raises:
        reportgen.recompute.RecomputeConfigError: a target matches no layer the switch turned on.
    """
    layers = [(p, m) for p, m in model.named_modules() if getattr(m, "gradient_checkpointing", False) is True]
    if not targets:
        return [p for p, _ in layers]
    kept = []
    for path, module in layers:
        module.gradient_checkpointing = any(matches(path, module, t) for t in targets)
        kept += [path] if module.gradient_checkpointing else []
    missed = [t for t in targets if not any(matches(p, m, t) for p, m in layers)]
    if missed:
        raise RecomputeConfigError(
            f"recompute.targets: {', '.join(map(repr, missed))} matched none of the layers the "
            f"model's switch recomputes ({', '.join(p for p, _ in layers[:3])}, ...)"
        )
    return kept


def _sized(task: Any, vocab_size: int | None, positions: str, **fields: Any) -> dict[str, Any]:
    """The config fields every factory sets alike: the embedding's rows (the task's characters, or
    ``vocab_size`` when given: a full-size vocabulary for the estimate; the task's ids stay below its
    own size), ``positions`` = the task's ``block_size``, token ids 0, then ``fields``.

    Raises:
        SetupError: the task has no ``vocab_size``/``block_size``, or ``vocab_size`` is below the task's.
    """
    try:
        task_vocab, block_size = int(task.vocab_size), int(task.block_size)
    except AttributeError as exc:
        raise SetupError(
            f"the Hugging Face factories size the model from the task's vocab_size and block_size; "
            f"{type(task).__name__} has no {exc.name}. Use task._target_=reportgen.models.hf.CausalLMTask"
        ) from exc
    if vocab_size is not None and int(vocab_size) < task_vocab:
        raise SetupError(
            f"model.vocab_size={vocab_size} is smaller than the task's {task_vocab} tokens; give "
            f"model.vocab_size>={task_vocab} or leave it unset"
        )
    rows = task_vocab if vocab_size is None else int(vocab_size)
    return {"vocab_size": rows, positions: block_size, "bos_token_id": 0, "eos_token_id": 0, **fields}


def gpt2(
    task: Any,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    vocab_size: int | None = None,
    use_cache: bool = False,
    attn_implementation: str | None = None,
    **config: Any,
) -> nn.Module:
    """A tiny ``GPT2LMHeadModel`` with random weights (seeded by reportgen before the call).

    Args:
        task: supplies ``vocab_size`` (characters) and ``block_size`` (``n_positions``, tokens).
        n_layer: decoder blocks.
        n_embd: residual stream width ``h``.
        n_head: attention heads ``a`` (must divide ``n_embd``).
        vocab_size: embedding rows and logits width (default: the task's vocabulary; larger for
            a full-size vocabulary, e.g. 50257 for GPT-2's own, in ``memory.estimate``).
        use_cache: return the key/value cache from the forward (default False: training never
            uses it, and with it on the plain twin returns ``past_key_values`` that the
            recompute twin, whose switch turns the cache off in training, does not).
        attn_implementation: ``"eager"``, ``"sdpa"``, ...; None = what transformers picks (sdpa
            where torch has it).
        **config: any further ``GPT2Config`` field, e.g. ``resid_pdrop=0.0``; dropout keeps
            GPT-2's defaults (0.1 on embeddings, residual and attention) unless set here.

    Returns:
        ``GPT2LMHeadModel``.

    Raises:
        SetupError: ``transformers`` is not installed, or ``vocab_size`` is below the task's.
    """
    require_transformers()
    from transformers import GPT2Config, GPT2LMHeadModel

    sized = _sized(task, vocab_size, "n_positions", use_cache=use_cache, attn_implementation=attn_implementation)
    return GPT2LMHeadModel(GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, **sized, **config))


def llama(
    task: Any,
    n_layer: int = 2,
    hidden_size: int = 64,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 172,
    vocab_size: int | None = None,
    use_cache: bool = False,
    attn_implementation: str | None = None,
    **config: Any,
) -> nn.Module:
    """A tiny ``LlamaForCausalLM`` with random weights (seeded by reportgen before the call).

    Args:
        task: supplies ``vocab_size`` (characters) and ``block_size`` (``max_position_embeddings``).
        n_layer: decoder layers (``num_hidden_layers``).
        hidden_size: residual stream width ``h``.
        num_attention_heads: query heads ``a`` (must divide ``hidden_size``).
        num_key_value_heads: key/value heads (grouped-query attention when fewer than ``a``).
        intermediate_size: SwiGLU MLP width.
        vocab_size: embedding rows and logits width (default: the task's vocabulary; e.g. 128256
            for a Llama-3-sized one in ``memory.estimate``).
        use_cache: see :func:`gpt2` (default False).
        attn_implementation: see :func:`gpt2` (None = transformers' choice, sdpa).
        **config: any further ``LlamaConfig`` field; Llama has no dropout except
            ``attention_dropout`` (0.0 by default).

    Returns:
        ``LlamaForCausalLM``.

    Raises:
        SetupError: ``transformers`` is not installed, or ``vocab_size`` is below the task's.
    """
    require_transformers()
    from transformers import LlamaConfig, LlamaForCausalLM

    sized = _sized(
        task, vocab_size, "max_position_embeddings", use_cache=use_cache, attn_implementation=attn_implementation
    )
    widths = {"hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": n_layer}
    heads = {"num_attention_heads": num_attention_heads, "num_key_value_heads": num_key_value_heads}
    return LlamaForCausalLM(LlamaConfig(**widths, **heads, pad_token_id=None, **sized, **config))


class CausalLMTask(CharTextTask):
    """:class:`reportgen.tasks.CharTextTask` with Hugging Face's calling convention.

    Same text, split, windows and metric (``bits_per_char``, lower is better) as the built-in
    ``gpt``; batches are ``({"input_ids": [b, block_size] int64, "attention_mask": [b, block_size] int64 ones},
    next-character ids [b, block_size] int64)``, so the model is called ``model(input_ids=..., attention_mask=...)``;
    it returns a ``ModelOutput`` whose ``logits`` are ``[batch, block_size, vocab]``.

    Args:
        block_size: characters per example (sequence length, tokens).
        val_fraction: share of the text held out.
        eval_batches: held-out batches of ``eval_batch_size`` windows for evaluation.
        eval_batch_size: windows per held-out batch.

    Raises:
        SetupError: ``transformers`` is not installed (checked first, before the text is read).
    """

    def __init__(
        self, block_size: int = 64, val_fraction: float = 0.1, eval_batches: int = 8, eval_batch_size: int = 32
    ):
        require_transformers()
        super().__init__(block_size, val_fraction, eval_batches, eval_batch_size)

    @staticmethod
    def _inputs(ids: Tensor) -> dict[str, Tensor]:
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def loss(self, output: Any, target: Tensor) -> Tensor:
        """Mean cross-entropy (nats/char) of ``output.logits`` ``[b, t, vocab]``, in float32."""
        return super().loss(output.logits, target)
