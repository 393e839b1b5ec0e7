"""Per-rank memory of one training step: a timeline by phase, a tensor peak and a reserved upper bound.

The traced step's *transient* bytes per phase (:mod:`reportgen.plan.trace`: activations, logits,
recompute and backward temporaries) do not depend on sharding: every rank runs the whole model on its
own micro-batch. What a rank holds besides is counted from the parameter count (bytes in B, ``P``
parameters, ``D`` ranks one copy is sharded over, ``U`` the largest FSDP unit's parameters):
:func:`state_bytes`, :func:`comm_bytes`, :func:`optimizer_temporaries`, each an upper bound
(:data:`reportgen.plan.page.ASSUMPTIONS`). With one process and everything in ``dtype`` the traced
step *is* the rank's step (:func:`is_traced_step`; equal to a real run's tracker peak,
tests/plan/test_plan.py). Reserved bytes are bounded by the allocator model :func:`reserved_upper`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from reportgen.plan.args import PlanArgs
from reportgen.plan.trace import PHASES, Figures

#: The caching allocator's rounding for large blocks (CUDACachingAllocator.cpp ``kRoundLarge``), B.
ROUND_BYTES = 2 * 2**20
#: Requests up to 1 MiB come from the small pool, rounded to 512 B (``kSmallSize``, ``kMinBlockSize``), B.
SMALL_BYTES, SMALL_ROUND_BYTES = 2**20, 512


@dataclass(kw_only=True)
class RankPlan:
    """One policy's per-rank step.

    Attributes:
        policy: the policy's name.
        timeline: ``{phase: {component: bytes}}`` at each phase's peak, B.
        tensor_peak: the largest phase total, B; peak_phase: where.
        reserved_upper: the allocator model's bound on peak reserved bytes, B.
        exact: True when the traced step is the rank's step (no composition).
        flops: forward + backward FLOPs per micro-batch (recompute included).
        recompute_flops: of those, the FLOPs recompute adds.
        after_forward: activations alive when backward starts, B.
        phase_reserved: ``{phase: reserved upper bound}`` (:func:`reserved_upper`), B.
        largest_batch: the largest micro-batch whose bound + margin fits (None: not asked).
    """

    policy: str
    timeline: dict[str, dict[str, float]] = field(default_factory=dict)
    tensor_peak: float = 0.0
    peak_phase: str = ""
    reserved_upper: float = 0.0
    exact: bool = False
    flops: float = 0.0
    recompute_flops: float = 0.0
    after_forward: float = 0.0
    phase_reserved: dict[str, float] = field(default_factory=dict)
    largest_batch: int | None = None

    def fits(self, args: PlanArgs) -> bool | None:
        """Upper bound + safety margin within ``memory_gib`` (None without a budget)."""
        if args.memory_gib is None:
            return None
        return self.reserved_upper <= args.memory_gib * 2**30 * (1 - args.safety_margin)


def is_traced_step(args: PlanArgs) -> bool:
    """True when the traced step is the rank's step: one process, no mixed precision, no accumulation, an
    optimizer the trace runs (Adafactor's is counted, not traced)."""
    pure = args.master_dtype == args.dtype == args.optim_dtype and args.optim != "adafactor"
    return args.strategy == "none" and pure and args.grad_accum == 1


def state_bytes(fig: Figures, args: PlanArgs) -> dict[str, float]:
    """``{"parameters", "gradients", "optimizer state"}`` per rank, B: ``P/D x master`` each for parameters and
    gradients; optimizer state AdamW ``2 P/D``, SGD ``P/D``, Adafactor-like rows + columns ``/D``, ``x optim``."""
    share, master, opt = fig.params / args.shard, args.master_dtype.itemsize, args.optim_dtype.itemsize
    states = {"fused": 2 * share, "foreach": 2 * share, "sgd": share, "adafactor": fig.factored / args.shard}
    return {"parameters": share * master, "gradients": share * master, "optimizer state": states[args.optim] * opt}


def comm_bytes(fig: Figures, args: PlanArgs, backward: bool) -> float:
    """Communication buffers (and autocast's weight copies) alive in a phase, B. FSDP2/HSDP: the unit in use
    and the prefetched one unsharded in the compute dtype (``2 U``), in backward the unit's unsharded
    gradients (``U``) and their reduce-scatter copy (``U x reduce``), HSDP's all-reduce buffer
    (``P/D x reduce``); none/DDP: autocast's compute-dtype weight copy (``P x compute``) when ``master``
    differs, DDP's gradient buckets in backward (``P x master``)."""
    compute, reduce, master = args.dtype.itemsize, args.reduce_dtype.itemsize, args.master_dtype.itemsize
    if args.strategy in ("fsdp", "hsdp"):
        held = 2 * fig.unit * compute
        if backward:
            held += fig.unit * compute + fig.unit * reduce
            held += fig.params / args.shard * reduce if args.strategy == "hsdp" else 0
        return held
    held = fig.params * compute if master != compute else 0.0
    if args.strategy == "ddp" and backward:
        held += fig.params * master
    return held


def optimizer_temporaries(fig: Figures, args: PlanArgs) -> float:
    """Bytes the optimizer step allocates beyond its state, B: foreach AdamW ``P/D x optim``
    (``_multi_tensor_adamw``'s ``exp_avg_sq_sqrt``), Adafactor-like the largest parameter in float32,
    fused AdamW and SGD none."""
    if args.optim == "foreach":
        return fig.params / args.shard * args.optim_dtype.itemsize
    return fig.largest_param * 4.0 if args.optim == "adafactor" else 0.0


def compose(fig: Figures, args: PlanArgs, policy: str) -> RankPlan:
    """The rank's timeline from the traced :class:`Figures` (see the module docstring)."""
    plan = RankPlan(
        policy=policy, flops=fig.flops, recompute_flops=fig.recompute_flops, after_forward=fig.after_forward
    )
    plan.exact = is_traced_step(args)
    state = state_bytes(fig, args)
    for phase in PHASES:
        if phase not in fig.total:
            continue
        if plan.exact:
            parts = {"traced step (all tensors)": fig.total[phase]}
        else:
            backward = phase in ("loss", "backward", "recompute", "optimizer step")
            grads = state["gradients"] if backward or args.grad_accum > 1 else 0.0
            parts = {"parameters": state["parameters"], "gradients": grads, "optimizer state": state["optimizer state"]}
            if phase == "optimizer step":
                parts["optimizer temporaries"] = optimizer_temporaries(fig, args)
            else:
                parts["communication buffers"] = comm_bytes(fig, args, phase != "forward")
                parts["activations and temporaries"] = fig.transient[phase]
        plan.timeline[phase] = parts
    totals = {phase: sum(parts.values()) for phase, parts in plan.timeline.items()}
    plan.peak_phase = max(totals, key=lambda phase: totals[phase])
    plan.tensor_peak = totals[plan.peak_phase]
    plan.phase_reserved = reserved_upper(plan, fig, args)
    plan.reserved_upper = max(plan.phase_reserved.values())
    return plan


def reserved_upper(plan: RankPlan, fig: Figures, args: PlanArgs) -> dict[str, float]:
    """Upper bound on reserved bytes (what ``torch.cuda.max_memory_reserved`` reads) per phase, B: the
    phase's tensor total, plus up to one caching-allocator granule (2 MiB, or 512 B when the persistent
    tensors average under 1 MiB) per persistent tensor (parameter, gradient, two optimizer states), plus
    ``fragmentation`` x the phase's transient bytes (freed, cached blocks too small for the next request)."""
    persistent = ("parameters", "gradients", "optimizer state", "traced step (all tensors)")
    copies = fig.param_tensors * 4
    bounds = {}
    for phase, parts in plan.timeline.items():
        transient = sum(v for k, v in parts.items() if k not in persistent)
        if plan.exact:
            transient = fig.transient.get(phase, 0.0)
        persistent_bytes = sum(v for k, v in parts.items() if k in persistent) - (transient if plan.exact else 0)
        granule = ROUND_BYTES if persistent_bytes / max(copies, 1) > SMALL_BYTES else SMALL_ROUND_BYTES
        bounds[phase] = sum(parts.values()) + copies * granule + args.fragmentation * transient
    return bounds


def largest_batch(at_b: RankPlan, at_next: RankPlan, args: PlanArgs) -> int:
    """The largest micro-batch whose reserved bound + margin fits ``memory_gib``: per phase, the line
    through the bounds at ``args.batch`` and ``args.batch + 1`` solved for the budget; the smallest
    answer over the phases (0: not even batch 1)."""
    budget = (args.memory_gib or 0.0) * 2**30 * (1 - args.safety_margin)
    best: int | None = None
    for phase, bound in at_b.phase_reserved.items():
        slope = at_next.phase_reserved.get(phase, bound) - bound
        fits = args.batch + math.floor((budget - bound) / slope) if slope > 0 else (None if bound <= budget else 0)
        if fits is not None:
            best = fits if best is None else min(best, fits)
    return max(0, best if best is not None else args.batch)
