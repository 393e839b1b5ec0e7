"""One warm training step on fake tensors, traced at small depth and scaled to the full depth.

A decoder's layers are a few kinds (:func:`reportgen.plan.model.layer_kinds`), each plain or recomputed
under a policy: a *variant* is (kind, recomputed). Every quantity counted here (the peak of live bytes
within each phase, activations alive when backward starts, FLOPs) is affine in the number of layers of
each variant while the top layers stay the same (a phase peaks at the top, where every layer below keeps
its activations, or at the bottom, where every layer above has its gradients), so
:func:`scaled_figures` traces two small depths (:func:`depth_plan`) and extrapolates; embedding, head
and loss are counted once. tests/plan/test_plan.py checks the scaled figures equal a full trace at small
depth (dense, sliding-window pattern, MoE).

The step is :class:`reportgen.twins.twin.TrainStep` under :class:`PhaseTracker` (torch's
``MemTracker`` via :class:`reportgen.memory.tracker.StepTracker`) and FlopCounterMode's formulas.
"""

from __future__ import annotations

import gc
import logging
import sys
import traceback
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, _MemRefType
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from reportgen.errors import SetupError
from reportgen.memory.step_peak import OUTSIDE, format_bytes
from reportgen.memory.tracker import StepTracker
from reportgen.plan.args import PlanArgs, PlanError
from reportgen.plan.model import (
    build_causal_lm,
    causal_lm_loss,
    decoder_layers,
    fake_batch,
    layer_count,
    layer_kinds,
    mask_constants,
    renumbers,
    shallow_config,
)
from reportgen.plan.policies import Policy, switch_on
from reportgen.twins.step import TrainingStep
from reportgen.twins.twin import TrainStep, Twin

#: Phases of the step, in order: ``loss`` is the head's and the loss's forward and backward (the logits
#: and their float32 upcast), ``backward`` the layers' backward outside recompute.
PHASES = ("forward", "loss", "backward", "recompute", "optimizer step")

#: The traced step's optimizer per ``optim=`` word (the plan's own state figures are per rank).
OPTIMIZERS = {
    "fused": {"_target_": "torch.optim.AdamW", "lr": 1e-4, "fused": True},
    "foreach": {"_target_": "torch.optim.AdamW", "lr": 1e-4, "foreach": True},
    "sgd": {"_target_": "torch.optim.SGD", "lr": 1e-4, "momentum": 0.9, "foreach": True},
    # Adafactor's step reads a value (.item()), which fake tensors cannot: its state is counted per rank
    # (reportgen.plan.rank), the traced step uses plain SGD, whose state is empty
    "adafactor": {"_target_": "torch.optim.SGD", "lr": 1e-4, "foreach": False},
}

_STATE = (_MemRefType.PARAM, _MemRefType.BUFFER, _MemRefType.GRAD, _MemRefType.OPT)
#: The traced step's task: reportgen's own step (one forward, the causal-LM loss, one backward).
CAUSAL_LM = SimpleNamespace(loss=causal_lm_loss)


@dataclass
class Figures:
    """What one step counts, all additive (bytes in B, FLOPs in floating-point operations).

    Attributes:
        total: ``{phase: peak live bytes}`` within each phase of :data:`PHASES`.
        transient: ``{phase: peak of live bytes minus parameters, buffers, gradients and optimizer
            state}`` within each phase (activations, temporaries, the batch).
        after_forward: activation bytes alive when backward starts (saved for backward, logits, loss).
        flops: FLOPs of forward, loss and backward (recompute included), FlopCounterMode's formulas.
        recompute_flops: of those, the FLOPs of ops run again in recompute (the policy's cost).
        params, param_tensors: parameter elements and tensors.
        factored: elements of an Adafactor-like factored second moment (rows + columns of a
            matrix, every element of a vector).
        largest_param: elements of the largest parameter (not additive: the largest seen).
        unit: elements of the largest FSDP unit (a decoder layer, the embedding, or the head with
            the final norm; not additive).
    """

    total: dict[str, float] = field(default_factory=dict)
    transient: dict[str, float] = field(default_factory=dict)
    after_forward: float = 0.0
    flops: float = 0.0
    recompute_flops: float = 0.0
    params: float = 0.0
    param_tensors: float = 0.0
    factored: float = 0.0
    largest_param: int = 0
    unit: int = 0

    def plus(self, other: Figures, times: float) -> Figures:
        """``self + times * other`` (phases missing on one side count 0)."""

        def add(a: dict, b: dict) -> dict:
            return {k: a.get(k, 0) + times * b.get(k, 0) for k in dict.fromkeys([*a, *b])}

        scalars = {
            k: getattr(self, k) + times * getattr(other, k)
            for k in ("after_forward", "flops", "recompute_flops", "params", "param_tensors", "factored")
        }
        largest = {k: max(getattr(self, k), getattr(other, k)) for k in ("largest_param", "unit")}  # not additive
        return Figures(add(self.total, other.total), add(self.transient, other.transient), **scalars, **largest)

    def minus(self, other: Figures) -> Figures:
        """``self - other``."""
        return Figures().plus(self, 1).plus(other, -1)


class PhaseTracker(StepTracker):
    """:class:`reportgen.memory.tracker.StepTracker` that also records, per phase of :data:`PHASES`, the peak of
    all live bytes and of the transient ones (all but parameters, buffers, gradients, optimizer
    state), and the activations alive at the end of the forward.

    Args:
        model: the traced model.
        heads: paths of the head modules (``lm_head``): their ops belong to the ``loss`` phase.
    """

    def __init__(self, model: torch.nn.Module, heads: set[str]) -> None:
        super().__init__(model)
        self._heads = heads
        self._backward_seen = False
        self.figures = Figures()

    def _plan_phase(self) -> tuple[str, bool]:
        """``(phase, in backward)``; backward is the autograd engine running (its graph task), so the
        loss's backward, outside every module, counts as backward too."""
        if self._in_opt:
            return "optimizer step", False
        backward = torch._C._current_graph_task_id() != -1
        if backward and self._in_ac:
            return "recompute", True
        inner = self._innermost()
        if inner == OUTSIDE or inner in self._heads:
            return "loss", backward
        return ("backward" if backward else "forward"), backward

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # MemTracker's method
        res = super().__torch_dispatch__(func, types, args, kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:  # FlopCounterMode's own formulas; the mode itself keeps tensors alive
            flops = count(*args, **(kwargs or {}), out_val=res)
            self.figures.flops += flops
            if self._in_ac and torch._C._current_graph_task_id() != -1:
                self.figures.recompute_flops += flops
        return res

    def _update_peak_stats(self, peak_state: Any) -> None:  # MemTracker's hook
        super()._update_peak_stats(peak_state)
        (phase, backward), fig = self._plan_phase(), self.figures
        for snap in self._curr_mem_snap.values():
            total = snap[_TOTAL_KEY]
            transient = total - sum(snap.get(k, 0) for k in _STATE)
            fig.total[phase] = max(fig.total.get(phase, 0), total)
            fig.transient[phase] = max(fig.transient.get(phase, 0), transient)
            self._backward_seen = self._backward_seen or backward or phase == "optimizer step"
            if not self._backward_seen:
                fig.after_forward = snap.get(_MemRefType.ACT, 0)


def trace_step(
    config: Any, indices: list[int], policy: Policy, args: PlanArgs, batch: int, optimizer: Any = None
) -> Figures:
    """Trace one warm step of the model with only the layers ``indices`` on fake tensors, with the
    optimizer of ``optim=`` (:data:`OPTIMIZERS`) or the ``_target_`` node ``optimizer`` (a run's own).

    The optimizer state exists before the step (one step on zero gradients first, as
    :func:`reportgen.memory.peak.warm_step_peak` with ``warm_steps=0``).

    Raises:
        SetupError: transformers cannot build the model (:func:`reportgen.models.hf.auto.auto_model`).
        PlanError: a kernel refuses the shape or dtype (the message names the fix).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    small = shallow_config(config, indices)
    quiet = logging.getLogger("torch._subclasses.fake_tensor")
    level, quiet.level = quiet.level, logging.CRITICAL  # a kernel's refusal is one line here, not its traceback
    gc.freeze()  # what exists now (torch, transformers, earlier traces) is not scanned by the collection below
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, mask_constants(sys.maxsize):
            model = build_causal_lm(small, args.dtype, args.attn)
            layers = decoder_layers(model)
            switch_on(model, policy.for_attn(args.attn), policy.flags(indices), [p for p, _ in layers])
            data = fake_batch(mode, batch, args.seq)
            twin = Twin.of(model, TrainingStep(CAUSAL_LM), optimizer or OPTIMIZERS[args.optim])
            step = TrainStep(twin, data)
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            step.optimizer.step()
            step.optimizer.zero_grad(set_to_none=True)
            head = model.get_output_embeddings()
            tracker = PhaseTracker(model, {n for n, m in model.named_modules() if m is head})
            tensors = [t for t in tree_leaves(data) if isinstance(t, torch.Tensor)]
            tracker.track_external(model, step.optimizer, *tensors)
            gc.collect()
            gc.disable()  # reference cycles are freed at the end, as the first collection after the step would
            try:
                with tracker:
                    step()
            finally:
                gc.enable()
    except (PlanError, SetupError):  # already one line naming the fix
        raise
    except Exception as exc:  # a kernel's refusal becomes one line naming the fix
        raise PlanError(refusal(exc, args)) from exc
    finally:
        quiet.setLevel(level)
        gc.unfreeze()
    figures = tracker.figures
    shapes = [p.shape for p in model.parameters()]
    figures.params, figures.param_tensors = float(sum(s.numel() for s in shapes)), float(len(shapes))
    figures.factored = float(sum(s[0] + s[1:].numel() if len(s) >= 2 else s.numel() for s in shapes))
    figures.largest_param = max(s.numel() for s in shapes)
    sizes = [sum(p.numel() for p in m.parameters()) for _, m in layers]
    figures.unit = int(max(sizes + [figures.params - sum(sizes) - head.weight.numel(), head.weight.numel()]))
    return figures


def _reason(exc: BaseException, limit: int = 200) -> str:
    """``Type: message`` on one line, cut at a word boundary (marked ``...``) when longer than ``limit``."""
    text = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def refusal(exc: BaseException, args: PlanArgs) -> str:
    """One line for a trace that raised: the cause and the fix."""
    text = " ".join(str(exc).split())
    frames = [f.f_code.co_name for f, _ in traceback.walk_tb(exc.__traceback__)]
    if "grouped_mm" in text or any("grouped_mm" in name for name in frames):
        return (
            f"the mixture-of-experts kernel (torch._grouped_mm) has no {args.dtype_name} implementation to count "
            f"with ({_reason(exc, 120)}); give dtype=bf16"
        )
    shape = f"seq={args.seq} batch={args.batch}"
    if isinstance(exc, MemoryError) or "can't allocate memory" in text:
        return (
            f"{shape} is too large to plan on this machine: the batch's attention mask alone is "
            f"{format_bytes(args.seq * args.batch)} of host memory (one byte per token); give a smaller seq= or batch="
        )
    if isinstance(exc, OverflowError) or "overflow" in text.lower():
        return (
            f"{shape} is too large to plan: a tensor of this step has more elements than torch can index "
            f"({_reason(exc, 120)}); give a smaller seq= or batch="
        )
    if any(w in text.lower() for w in ("sdpa", "scaled_dot_product", "attn_implementation", "attention")):
        return f"attention with attn={args.attn} cannot run this config ({_reason(exc)}); give attn=eager"
    return f"transformers could not run a training step of this config ({_reason(exc)}); check the config"


def variants(config: Any, policy: Policy) -> list[tuple]:
    """Per decoder layer (bottom first): ``(kind, recomputed)``, or ``(index,)`` when the config
    places kinds by rules :func:`reportgen.plan.model.shallow_config` cannot renumber (then every
    layer is its own variant and the trace is at full depth)."""
    n = layer_count(config)
    if not renumbers(config):
        return [(i,) for i in range(n)]
    return list(zip(layer_kinds(config), policy.flags(list(range(n)))))


def period(kinds: list) -> int:
    """The shortest ``p`` with ``kinds[i] == kinds[i + p]`` throughout (``len(kinds)`` when none is shorter)."""
    return next(
        (p for p in range(1, len(kinds)) if all(kinds[i] == kinds[i + p] for i in range(len(kinds) - p))),
        max(len(kinds), 1),
    )


def depth_plan(per_layer: list) -> tuple[list[int], list[int], int]:
    """``(base, grown, m)``: the layers of the base trace and of the grown one, and how many times
    ``grown - base`` is added. The base is the bottom layer, whatever of the middle is left after whole
    periods, and the shortest top slice holding every variant; grown has one more period in the middle.
    With a single variant (a dense model under none, full or selective recompute) the bottom layer is
    like any other: the base is the top layer alone and grown the top two."""
    n = len(per_layer)
    if n >= 2 and len(set(per_layer)) == 1:  # one variant: top layer alone, then one more below it
        return [n - 1], [n - 2, n - 1], n - 1
    last = {v: i for i, v in enumerate(per_layer)}
    top = list(range(max(min(last.values()), 1), n))
    middle = list(range(1, top[0])) if top else []
    p = period([per_layer[i] for i in middle])
    m = len(middle) // p if middle else 0
    base = [0, *middle[m * p :], *top]
    grown = [0, *middle[(m - 1) * p :], *top] if m else base
    return base, grown, m


def scaled_figures(
    config: Any, policy: Policy, args: PlanArgs, batch: int, optimizer: Any = None
) -> tuple[Figures, int]:
    """The full model's :class:`Figures` under ``policy`` at ``batch``, from two small-depth traces
    (:func:`depth_plan`): ``base + m x (grown - base)``.

    Returns:
        ``(figures, traces)``: the scaled figures and how many steps were traced.
    """
    base, grown, m = depth_plan(variants(config, policy))
    traced = trace_step(config, base, policy, args, batch, optimizer)
    if not m:
        return traced, 1
    return traced.plus(trace_step(config, grown, policy, args, batch, optimizer).minus(traced), m), 2
