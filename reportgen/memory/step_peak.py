"""What a step's memory peak is, and the sentences the memory rows say about it.

:class:`StepPeak` is the peak of live tensor bytes of one warm training step, as
:class:`reportgen.memory.tracker.StepTracker` counts it (phase, module, region, categories);
:func:`where`, :func:`increase_cause` and :func:`peak_sentence` word it for the rows of the
memory checks; :func:`reportgen.memory.peak.warm_step_peak` measures it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reportgen.memory.saved import REST, SavedActivations

#: Categories of what is alive at the peak, in report order; they sum to the peak. From
#: MemTracker: parameters, buffers, gradients (of parameters), optimizer state (also the
#: optimizer step's own temporaries: MemTracker files everything created in ``step()`` there),
#: batch (the tensors passed to ``track_external``), backward temporaries (created in backward
#: outside any recompute: activation gradients and the like). Its activations are split here:
#: saved activations (forward outputs autograd keeps, and recompute regions' inputs),
#: recomputed activations (created while a region's forward runs again in backward) and other
#: activations (forward outputs nobody keeps for backward, e.g. the loss).
CATEGORIES = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer state",
    "batch",
    "saved activations",
    "recomputed activations",
    "other activations",
    "backward temporaries",
)

#: Module name at a peak that happens outside every module (the loss, the optimizer).
OUTSIDE = "(outside every module)"


def format_bytes(n: float) -> str:
    """``n`` bytes for a sentence, in binary units: ``"512 B"``, ``"42.75 KiB"``, ``"8.98 MiB"``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclass
class StepPeak:
    """The peak of live tensor bytes during one warm training step of one twin.

    Attributes:
        peak_bytes: live tensor bytes at the peak, B (every category below, summed).
        baseline_bytes: live tensor bytes when the step starts (weights, optimizer state, the
            batch), B.
        phase: what was running when the peak was reached: ``forward``, ``backward``, ``recompute`` (inside
            backward) or ``optimizer step``.
        module: innermost module running at the peak, plain-model path (``""`` = the root
            module; :data:`OUTSIDE` when none ran, e.g. in the optimizer step).
        region: during ``recompute``, the plain-model path of the region being recomputed
            (else None).
        recomputed_by_region: ``{region path: bytes}`` of recomputed activations alive at the
            peak, per region that produced them (empty without recompute), B.
        categories: ``{category: bytes}`` alive at the peak, keys :data:`CATEGORIES`, B.
        device: the device counted (``"cpu"``, ``"cuda:0"``).
        cuda: on CUDA, ``{"peak_allocated_bytes", "peak_reserved_bytes",
            "baseline_allocated_bytes"}`` of the same step (``torch.cuda`` memory statistics,
            reset right before it), B; None elsewhere.
    """

    peak_bytes: int
    baseline_bytes: int
    phase: str
    module: str
    region: str | None
    categories: dict[str, int]
    device: str
    recomputed_by_region: dict[str, int] = field(default_factory=dict)
    cuda: dict[str, int] | None = None

    def largest_region(self) -> tuple[str, int] | None:
        """``(region path, bytes)`` of the region with the most recomputed activations alive
        at the peak, or None when none are."""
        live = [(r, b) for r, b in self.recomputed_by_region.items() if b > 0]
        return max(live, key=lambda item: item[1]) if live else None


# --------------------------------------------------------------------------- wording for the rows
def where(peak: StepPeak) -> str:
    """``"backward at blocks.3.mlp"``, ``"recompute of blocks.0 at blocks.0.attn"``, ``"optimizer step"``."""
    if peak.phase == "optimizer step":
        return peak.phase
    if peak.module == OUTSIDE:
        return f"{peak.phase}, outside every module (the loss)"
    at = peak.module or "the model's own forward"
    return f"{peak.phase} of {peak.region} at {at}" if peak.region else f"{peak.phase} at {at}"


def increase_cause(plain: SavedActivations, rec: SavedActivations, classes: dict[str, str] | None = None) -> str:
    """Which wrapped modules cause recompute to keep more than the plain run, for a detail sentence.

    A module's cost is what is kept while it runs or as its inputs, plus its outputs kept by the
    rest of the model (:meth:`reportgen.memory.saved.SavedActivations.caused_by`), so a recomputed
    ReLU whose output the next Linear still keeps is charged to the ReLU, not to "the rest".

    Args:
        plain, rec: saved activations of the two twins (same module paths).
        classes: ``{path: class name}`` to name the modules by (optional).
    """
    classes = classes or {}
    order = {p: i for i, p in enumerate(plain.per_module)}
    grown = sorted(
        ((rec.caused_by(p) - plain.caused_by(p), p) for p in plain.per_module if p != REST),
        key=lambda item: (-item[0], order[item[1]]),
    )  # largest first, then in model order
    grown = [(delta, p) for delta, p in grown if delta > 0]
    if not grown:
        return f"the increase is outside every wrapped module ({REST})"
    names = ", ".join(f"{p} ({classes[p]})" if p in classes else p for _, p in grown[:4]) + (
        f" and {len(grown) - 4} more" if len(grown) > 4 else ""
    )
    outputs = sum(rec.produced_by.get(p, 0) for _, p in grown)
    why = (
        ": each region keeps its input for the recompute while the layer after it still keeps its output"
        if outputs
        else ""
    )
    return (
        f"the increase ({format_bytes(sum(d for d, _ in grown))}) comes from the wrapped module(s) {names}{why}; "
        "recompute larger blocks (e.g. whole layers) instead"
    )


def peak_sentence(
    plain: StepPeak,
    rec: StepPeak,
    share: float,
    share_min: float,
    saved: dict[str, SavedActivations] | None,
    classes: dict[str, str] | None = None,
) -> str:
    """The verdict row's detail: the peak saving, or the increase and who causes it, or why
    recompute does not lower the peak and what to change."""
    both = (
        f"{format_bytes(plain.peak_bytes)} plain ({where(plain)}) → {format_bytes(rec.peak_bytes)} recompute "
        f"({where(rec)})"
    )
    if share >= share_min:
        return f"recompute lowers the step's peak by {share:.1%} ({format_bytes(plain.peak_bytes - rec.peak_bytes)}): {both}"
    if rec.peak_bytes > plain.peak_bytes:
        cause = (
            increase_cause(saved["plain"], saved["recompute"], classes)
            if saved
            else "the saved-bytes measurement failed"
        )
        return f"{-share:+.1%}: recompute costs memory here: the step's peak rises, {both}; {cause}"
    head = f"recompute does not lower the step's peak (by {share:.1%}, threshold {share_min:.1%}): {both}"
    region = rec.largest_region()
    if region is not None and rec.phase in ("backward", "recompute"):
        path, nbytes = region
        held = saved["plain"].per_module.get(path) if saved else None
        if held is not None and saved and saved["plain"].total_bytes:
            held_share = held / saved["plain"].total_bytes
        else:  # a model's own switch: compare with the activations alive at the plain peak
            acts = plain.categories["saved activations"] + plain.categories["other activations"]
            held_share = nbytes / acts if acts else 1.0
        return (
            f"{head}; one region ({path}) holds {held_share:.0%} of the activations and is recomputed at once, so "
            f"backward brings {format_bytes(nbytes)} of them back together; split it (e.g. one region per layer)"
        )
    if plain.phase == "optimizer step" and rec.phase == "optimizer step":
        fixed = sum(rec.categories[c] for c in ("parameters", "buffers", "gradients", "optimizer state"))
        return (
            f"{head}; both peaks are in the optimizer step, where parameters, gradients and optimizer state "
            f"({format_bytes(fixed)}) are alive and no activation is: recompute cannot lower it at this batch; "
            "activations set the peak only at a larger batch or sequence"
        )
    acts = sum(rec.categories[c] for c in ("saved activations", "recomputed activations", "other activations"))
    return (
        f"{head}; at the recompute peak {format_bytes(acts)} are activations and "
        f"{format_bytes(rec.peak_bytes - acts)} weights, gradients, optimizer state, batch and backward temporaries"
    )
