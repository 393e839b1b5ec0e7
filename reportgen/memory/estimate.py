"""GPU-free estimate of saved-activation bytes and the step peak at a target shape, under ``FakeTensorMode``.

The model and batch are built inside :class:`torch._subclasses.fake_tensor.FakeTensorMode`:
every tensor carries shape, dtype, device and storage size but no data, so a 7B-shaped
layer stack at sequence 4096 costs no activation memory. The same counter as the measured
figure (:func:`reportgen.memory.saved.saved_activation_bytes`) runs on the fake tensors, so an
estimate and a measurement at the same shape must agree exactly; the memory check runs
both at the measured shape to show that they do. The step peak is counted the same way: one
warm training step of each fake twin under the measured figure's tracker
(:func:`reportgen.memory.peak.warm_step_peak`). Neither counts what is not a tensor: allocator
fragmentation and caching, communication buffers, CUDA workspaces (cuBLAS, cuDNN).

For transformer-shaped models the per-layer figure is set beside the formula of Korthikanti
et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1:
``sbh(34 + 5as/h)`` bytes per layer with 16-bit activations and 1-byte dropout masks
(``s`` sequence, ``b`` batch, ``h`` width, ``a`` heads), and ``2sbh`` per layer under full
recomputation.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from reportgen.errors import UsageError
from reportgen.memory.peak import warm_step_peak
from reportgen.memory.saved import SavedActivations, saved_activation_bytes
from reportgen.memory.step_peak import StepPeak
from reportgen.structure import describe, named_tensors
from reportgen.tasks import batch_to
from reportgen.twins.recompute import apply_recompute, find_targets, is_model_switch
from reportgen.twins.setup import DTYPES, Setup, autocast_forward
from reportgen.twins.step import TrainingStep
from reportgen.twins.template import copy_module
from reportgen.twins.twin import TrainStep, Twin

log = logging.getLogger("reportgen")

#: Keys ``cfg.memory.estimate`` understands.
ESTIMATE_KEYS = {"model", "task", "batch_size", "dtype"}


class EstimateConfigError(UsageError, ValueError):
    """``cfg.memory.estimate`` has an unknown key or a bad value."""


class NotEstimableError(Exception):
    """The model cannot run on fake tensors; ``reason`` says why in words (never the exception text)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


#: The precision the fake (shape-only) kernel of ``aten._grouped_mm`` accepts in torch 2.13 (its meta
#: function checks for bfloat16, although the CPU kernel takes float32): mixture-of-experts layers of
#: transformers 5 call it, so their estimate runs in this precision.
FAKE_KERNEL_DTYPE = "bfloat16"

#: Exception class names (torch's fake-tensor internals) that mean "the code read a tensor's values".
DATA_DEPENDENT = (
    "DataDependentOutputException",
    "DynamicOutputShapeException",
    "GuardOnDataDependentSymNode",
    "UnsupportedOperatorException",
)


def fake_failure(exc: BaseException) -> str:
    """Why a model cannot run on fake tensors, in words a user can act on (the log has the exception)."""
    names = {type(e).__name__ for e in _chain(exc)}
    text = " ".join(str(e) for e in _chain(exc))
    if names & set(DATA_DEPENDENT) or "data-dependent" in text or "data dependent" in text:
        return (
            "the model's code reads tensor values while it is built or run (.item(), torch.allclose, a shape that "
            "depends on the data, e.g. routing to experts), and fake tensors have shapes but no values"
        )
    if "Expected inputs of BF16" in text:
        return (
            f"a shape-only kernel the model uses (torch._grouped_mm, mixture-of-experts layers) accepts only "
            f"{FAKE_KERNEL_DTYPE}"
        )
    return (
        "an operation of the model has no shape-only (fake-tensor) kernel in this torch, or fails on one; "
        "the run's log has the exception"
    )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (Hydra wraps a factory's exception in an InstantiationException)."""
    out: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and at not in out:
        out.append(at)
        at = at.__cause__ or at.__context__
    return out


def estimate_or_reason(setup: Setup, overrides: Any = None) -> Estimate:
    """:func:`estimate_saved_activations`, run again in :data:`FAKE_KERNEL_DTYPE` when a shape-only kernel
    accepts only that precision (``Estimate.dtype_note`` says so).

    Raises:
        EstimateConfigError: see :func:`validate_overrides`.
        NotEstimableError: the model cannot run on fake tensors (:func:`fake_failure` says why).
    """
    over = validate_overrides(overrides)
    try:
        return estimate_saved_activations(setup, over)
    except EstimateConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the reason goes in words into the report, the exception into the log
        log.info("memory estimate on fake tensors failed", exc_info=True)
        reason = fake_failure(exc)
        if FAKE_KERNEL_DTYPE not in reason or over.get("dtype", setup.config.dtype) == FAKE_KERNEL_DTYPE:
            raise NotEstimableError(reason) from None
    try:
        estimate = estimate_saved_activations(setup, {**over, "dtype": FAKE_KERNEL_DTYPE})
    except Exception as exc:  # noqa: BLE001 - as above
        log.info("memory estimate on fake tensors in %s failed", FAKE_KERNEL_DTYPE, exc_info=True)
        raise NotEstimableError(fake_failure(exc)) from None
    estimate.dtype_note = f"estimated in {FAKE_KERNEL_DTYPE}, not {over.get('dtype', setup.config.dtype)}: {reason}"
    return estimate


@dataclass
class TransformerShape:
    """The symbols of Korthikanti et al. 2022 for one model and batch.

    Attributes:
        s: sequence length, tokens.
        b: batch size, sequences.
        h: hidden width (residual stream features).
        a: attention heads.
        element_bytes: bytes per activation value (2 in the paper, 4 in float32).
        layernorms: LayerNorm modules per layer (each keeps a mean and a reciprocal std, [b, s]).
    """

    s: int
    b: int
    h: int
    a: int
    element_bytes: int
    layernorms: int = 2

    def formula_bytes(self, element_bytes: int = 2, mask_bytes: int = 1) -> int:
        """Per-layer activation bytes without recomputation, Korthikanti et al. 2022 eq. (1).

        The paper's ``sbh(34 + 5as/h)`` assumes 2-byte activations and 1-byte dropout masks.
        Per kind of value it is ``sbh(16e + 2m) + as²b(2e + m)`` for ``e`` bytes per
        activation value and ``m`` per mask value: ``16e`` = QKV input, Q, K, V, projection
        input, MLP input, GELU input (4h wide), second linear input (4h wide) and two
        LayerNorm inputs, in units of ``sbh`` values; ``2m`` = two dropout masks; ``2e + m`` =
        softmax output, its dropout mask, the dropped-out probabilities. ``e = 2, m = 1`` gives
        the paper's 34 and 5.

        Args:
            element_bytes: ``e``, bytes per activation value.
            mask_bytes: ``m``, bytes per dropout-mask value.

        Returns:
            Bytes per transformer layer.
        """
        sbh, as2b = self.s * self.b * self.h, self.a * self.s * self.s * self.b
        return sbh * (16 * element_bytes + 2 * mask_bytes) + as2b * (2 * element_bytes + mask_bytes)

    def full_recompute_bytes(self, element_bytes: int = 2) -> int:
        """Per-layer bytes under full recomputation: the layer input only, ``2sbh`` in 16-bit
        (Korthikanti et al. 2022, §4.3), ``e·sbh`` for ``e`` bytes per value."""
        return element_bytes * self.s * self.b * self.h


@dataclass
class Estimate:
    """Saved-activation bytes of both twins at one shape, computed on fake tensors.

    Attributes:
        inputs: shape and dtype of the model input, e.g. ``"[8, 1024] int64"``.
        overrides: the model/task/batch overrides that produced this shape (empty = measured shape).
        plain: what the plain twin keeps for backward, B.
        recompute: what the recompute twin keeps for backward, B.
        transformer: Korthikanti symbols when the model is transformer-shaped, else None.
        dtype: precision of the estimate.
        wrapped_paths: the wrapped modules' paths in the plain model at this shape.
        plain_peak, recompute_peak: peak of live tensor bytes of one warm step of each twin
            (:class:`reportgen.memory.step_peak.StepPeak`), or None when it could not be counted.
        peak_error: why the step peak could not be counted, in words ("" when it was).
        dtype_note: why the estimate ran in another precision than asked ("" when it did not).
    """

    inputs: str
    overrides: dict[str, Any]
    plain: SavedActivations
    recompute: SavedActivations
    transformer: TransformerShape | None = None
    dtype: str = "float32"
    wrapped_paths: list[str] = field(default_factory=list)
    plain_peak: StepPeak | None = None
    recompute_peak: StepPeak | None = None
    peak_error: str = ""
    dtype_note: str = ""

    def per_layer(self, variant: str) -> float:
        """Median bytes over the wrapped modules (one transformer layer each, for a stack), B."""
        saved = self.plain if variant == "plain" else self.recompute
        values = [saved.per_module[p] for p in self.wrapped_paths if p in saved.per_module]
        return float(statistics.median(values)) if values else float("nan")


def validate_overrides(overrides: Any) -> dict[str, Any]:
    """``cfg.memory.estimate`` as a plain dict, checked.

    Raises:
        EstimateConfigError: an unknown key, or a dtype reportgen does not know.
    """
    plain = (
        OmegaConf.to_container(overrides, resolve=True) if isinstance(overrides, DictConfig) else dict(overrides or {})
    )
    unknown = set(plain) - ESTIMATE_KEYS
    if unknown:
        raise EstimateConfigError(f"memory.estimate: unknown key(s) {sorted(unknown)}; use {sorted(ESTIMATE_KEYS)}")
    if "dtype" in plain and plain["dtype"] not in DTYPES:
        raise EstimateConfigError(f"memory.estimate.dtype={plain['dtype']!r} is not one of {', '.join(DTYPES)}")
    return plain


def transformer_shape(
    model: nn.Module, inputs: Any, wrapped_paths: list[str], dtype: torch.dtype
) -> TransformerShape | None:
    """Korthikanti symbols when ``model`` looks like a transformer stack, else None.

    Transformer-shaped means: the inputs are ``[batch, seq, ...]``, and the first wrapped
    module contains a module with an integer ``heads`` / ``num_heads`` / ``n_head`` attribute
    (``a``) and a LayerNorm (``h`` = its normalised width).
    """
    first = next((t for _, t in named_tensors(inputs, "input")), None)
    if not wrapped_paths or first is None or first.dim() < 2:
        return None
    try:
        layer = model.get_submodule(wrapped_paths[0])
    except AttributeError:
        return None
    heads = width = None
    norms = sum(isinstance(m, nn.LayerNorm) for m in layer.modules())
    for module in layer.modules():
        for attr in ("heads", "num_heads", "n_head"):
            if heads is None and isinstance(getattr(module, attr, None), int):
                heads = getattr(module, attr)
        if width is None and isinstance(module, nn.LayerNorm):
            width = int(module.normalized_shape[-1])
    if heads is None or width is None:
        return None
    return TransformerShape(
        s=int(first.shape[1]), b=int(first.shape[0]), h=width, a=heads, element_bytes=dtype.itemsize, layernorms=norms
    )


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """While inside, new floating tensors (and so a factory's parameters) are created in ``dtype``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def fake_model(model_cfg: dict, task: Any, seed: int, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Instantiate the model factory inside the active ``FakeTensorMode``.

    Parameters are created directly in ``dtype`` on ``device`` (default dtype and device
    contexts): ``Module.to`` cannot convert fake parameters (it swaps tensors, which fake
    tensors refuse), so it is only called when the factory ignored the defaults.
    """
    factory = get_method(model_cfg["_target_"])
    extra = {"task": task} if "task" in inspect.signature(factory).parameters else {}
    torch.manual_seed(seed)
    with torch.device(device), default_dtype(dtype):
        model = instantiate(model_cfg, **extra)
    if any(p.dtype != dtype or not _same_device(p.device, device) for p in model.parameters() if p.is_floating_point()):
        model = model.to(device=device, dtype=dtype)
    return model


def fake_copy(template: nn.Module, mode: FakeTensorMode, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The run's one build as fake tensors on ``device`` (floating ones in ``dtype``), the factory not run again;
    called inside ``mode``, copied outside it, so a plain tensor attribute stays as the factory made it."""
    fake = lambda t: mode.from_tensor(t).to(device, dtype if t.is_floating_point() else t.dtype)
    with unset_fake_temporarily():
        return copy_module(template, fake)


def _same_device(actual: torch.device, wanted: torch.device) -> bool:
    """``cuda:0`` is the ``cuda`` asked for (seen on an H200: comparing them as unequal sent fake
    parameters through ``Module.to``, which cannot swap them)."""
    wanted = torch.device(wanted)
    return actual.type == wanted.type and (wanted.index is None or actual.index == wanted.index)


def estimate_saved_activations(setup: Setup, overrides: Any = None) -> Estimate:
    """Saved-activation bytes of the plain and recompute twins at a (target) shape, on fake tensors.

    Args:
        setup: the run's setup (model/task config, recompute settings, seeds, device).
        overrides: ``{"model": {...}, "task": {...}, "batch_size": N, "dtype": "bfloat16"}``,
            each optional: keyword overrides of the model and task configs (e.g. gpt's
            ``width/depth/heads`` and the task's ``block_size``), the examples per batch
            (default ``parity.batch_size``) and the precision (default ``cfg.dtype``).
            Empty = the measured shape, which validates the estimator.

    Returns:
        An :class:`Estimate` with saved bytes and the step peak of both twins (the step uses
        ``budget.optimizer``, its state created by one step on zero gradients first). No real
        tensor of activation size is allocated.

    Raises:
        EstimateConfigError: see :func:`validate_overrides`.
    """
    over = validate_overrides(overrides)
    cfg = setup.config
    model_cfg = {**cfg.model, **over.get("model", {})}
    task = setup.task
    if over.get("task"):
        task = instantiate({**cfg.task, **over["task"]})
    own = TrainingStep(task)  # reportgen's forward and loss: a user's step may not take fake tensors
    batch_size = int(over.get("batch_size", cfg.parity.batch_size))
    dtype_name = over.get("dtype", cfg.dtype)
    dtype = DTYPES[dtype_name]
    generator = torch.Generator().manual_seed(cfg.seed)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        batch = batch_to(task.make_batch(generator, batch_size), setup.device, dtype)
        saved, peaks, peak_error = {}, {}, ""
        for recompute in (False, True):
            model = (
                fake_copy(setup.template.module, mode, setup.device, dtype)
                if not over.get("model") and setup.template.rebuild is None  # the measured shape: the one build
                else fake_model(model_cfg, task, cfg.seed, setup.device, dtype)
            )
            if recompute:
                apply_recompute(model, setup.config.recompute)
            else:  # the target shape may have another depth: find the wrapped paths on this model
                paths = (
                    [w.path for w in setup.wrapped]
                    if is_model_switch(setup.config.recompute)
                    else [w.path for w in find_targets(model, setup.config.recompute.targets)]
                )
                shape = transformer_shape(model, batch[0], paths, dtype)
            if setup.autocast_dtype is not None:  # the same precision as the measured twins
                model.forward = autocast_forward(model.forward, setup.device.type, setup.autocast_dtype)
            saved[recompute] = saved_activation_bytes(model.train(), batch, own, cfg.forward_seed, paths)
            if not peak_error:
                try:
                    step = TrainStep(Twin.of(model, own, cfg.budget.optimizer), batch, cfg.forward_seed)
                    peaks[recompute] = warm_step_peak(step, warm_steps=0)
                except Exception as exc:  # noqa: BLE001 - the saved-bytes estimate stands on its own
                    log.info("step peak estimate on fake tensors failed", exc_info=True)
                    peak_error = fake_failure(exc)
            del model
        inputs = describe(batch[0])
    return Estimate(
        inputs,
        over,
        saved[False],
        saved[True],
        shape,
        dtype_name,
        paths,
        peaks.get(False) if not peak_error else None,
        peaks.get(True) if not peak_error else None,
        peak_error,
    )


def dropout_mask_bytes(device: torch.device, element_bytes: int) -> int:
    """Bytes per value of a dropout mask kept for backward on ``device``.

    On CUDA, ``nn.Dropout`` uses the fused ``native_dropout`` kernel, whose mask is ``bool``
    (1 byte, as Korthikanti et al. assume). On CPU, ``at::dropout`` multiplies by a noise
    tensor of the activation's dtype, so the mask costs ``element_bytes`` per value.
    """
    return 1 if device.type == "cuda" else element_bytes


def layernorm_stat_bytes(device: torch.device, element_bytes: int) -> int:
    """Bytes per value of the mean and reciprocal std LayerNorm keeps for backward.

    On CUDA they are kept in the accumulation type (float32 for 16-bit inputs); on CPU in the
    input's dtype (measured with torch 2.13).
    """
    return max(4, element_bytes) if device.type == "cuda" else element_bytes
