"""The plan's page: plan.html (``templates/plan.html.j2``) and plan.pdf (:func:`reportgen.report.render.write_pdf`)."""

from __future__ import annotations

from typing import Any

from reportgen.plan.args import DTYPES, PlanArgs
from reportgen.plan.rank import RankPlan

#: How the figures are counted and what each is biased by; printed on the page (docs/plan.md).
ASSUMPTIONS = (
    "Two small-depth steps per policy are traced on fake tensors (the bottom layer and the top layers that hold every "
    "kind of layer, then one more period of the layers' pattern) and scaled to the full depth; embedding, head and "
    "loss are counted once. Equal to a full trace and to a real CPU step within 1 % in tests/plan/test_plan.py.",
    "The batch is packed (an all-ones mask, sdpa with is_causal) and the loss is the cross-entropy of the float32 "
    "upcast of the logits over the full vocabulary, as torchtitan computes it.",
    "Per rank, upper bounds: every sharded gradient from the start of backward; two unsharded FSDP units in flight "
    "(the one in use and the prefetched one), each the largest unit; in backward the unit's unsharded gradients and "
    "their reduce-scatter copy; DDP's gradient buckets as a full copy of the gradients; foreach AdamW's one "
    "parameter-sized temporary.",
    "Reserved upper bound: the tensor peak, one allocator granule per persistent tensor (2 MiB; 512 B for small "
    "tensors) and the fragmentation share of the transient bytes at the peak. The fragmentation share is an "
    "assumption (fragmentation=), not calibrated on a CUDA device here.",
    "Extra FLOPs of recompute are those of the ops torch's FlopCounterMode has formulas for (matmuls and attention); "
    "recomputed element-wise ops (norms, activations, rotary embeddings) take time but count 0, so a policy that "
    "saves every matmul output shows about +0 %.",
    "Not counted: the CUDA context, NCCL's own buffers (outside torch's caching allocator), cuBLAS workspaces.",
)


def _word(dtype: Any) -> str:
    return next(k for k, v in DTYPES.items() if v == dtype)


def html_text(plans: list[RankPlan], args: PlanArgs, chosen: RankPlan | None, meta: dict[str, Any]) -> str:
    """plan.html through ``templates/plan.html.j2`` (autoescape, StrictUndefined).

    Args:
        plans: one per policy; chosen: the chosen one (or None).
        meta: ``{"config", "traces", "seconds", "created"}``.
    """
    from reportgen.report.render import environment

    dtypes = {"master": _word(args.master_dtype), "reduce": _word(args.reduce_dtype), "optim": _word(args.optim_dtype)}
    template = environment().get_template("plan.html.j2")
    return template.render(plans=plans, args=args, chosen=chosen, dtypes=dtypes, assumptions=ASSUMPTIONS, **meta)


def pdf_bytes(html: str, created: str, csv: str) -> bytes:
    """plan.pdf (PDF/A-3b) with plan.csv attached."""
    from reportgen.report.pdf import write_pdf

    return write_pdf(html, created, [("plan.csv", csv.encode(), "Data", "the plan's figures")])
