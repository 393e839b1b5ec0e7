"""Peak live tensor memory of one warm training step, on any device, counted with torch's own tracker.

What autograd keeps after the forward (:mod:`reportgen.memory.saved`) is not what a step needs: a
recompute region's activations are alive again while backward recomputes it, and gradients,
optimizer state and backward temporaries come on top. A memory claim is about the step's
**peak** (DESIGN.md, contracts), so :func:`warm_step_peak` counts the live tensor bytes through forward,
backward and the optimizer step with ``torch.distributed._tools.mem_tracker.MemTracker`` (a
``TorchDispatchMode`` that counts each storage once; fake tensors too), extended by
:class:`reportgen.memory.tracker.StepTracker` into a :class:`StepPeak` (:mod:`reportgen.memory.step_peak`).
On CUDA the allocator's peak is read beside it: it rounds every block up (512 B) and keeps workspace.

Known limits (MemTracker's docstring): tensors created under ``no_dispatch`` and storages
resized outside ``UntypedStorage.resize_`` are not seen; fragmentation and the caching
allocator's reserve are not tensors and are never counted here.
"""

from __future__ import annotations

import gc

import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves

from reportgen.memory.device_peak import reset_peaks
from reportgen.memory.instrument import instrument
from reportgen.memory.step_peak import StepPeak
from reportgen.twins.twin import TrainStep


def warm_step_peak(step: TrainStep, warm_steps: int = 1) -> StepPeak:
    """Peak live tensor bytes of one warm training step (:class:`reportgen.twins.twin.TrainStep`: the twin's
    step, then ``zero_grad(set_to_none=True)``).

    ``warm_steps`` steps run first untracked, so the optimizer state exists (0: one optimizer
    step on zero gradients instead, which creates the same state tensors without a forward;
    the estimate uses it, since a forward on fake tensors costs seconds at a target shape);
    then the model, optimizer and batch are registered with the tracker
    (``MemTracker.track_external``) and one step runs inside it. On CUDA the allocator's
    statistics are reset right before that step and read after ``torch.cuda.synchronize``
    (torch.cuda memory-statistics docs), so both peaks describe the same step.

    Args:
        step: the step to measure (``step.batch`` on the model's device; the model's weights change).
        warm_steps: untracked training steps first (0: an optimizer step on zero gradients).

    Returns:
        :class:`StepPeak` (bytes, B).
    """
    model, batch, optimizer = step.model, step.batch, step.optimizer
    if warm_steps > 0:
        for _ in range(warm_steps):
            step()
    else:  # the optimizer state only: one step on zero gradients (same tensors, no forward)
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    device = next(iter(model.parameters()), torch.empty(0)).device
    if device.type == "cuda" and device.index is None:  # as MemTracker keys it
        device = torch.device("cuda", torch.cuda.current_device())
    from reportgen.memory.tracker import StepTracker  # lazy: MemTracker's import costs ~1.9 s CPU

    tracker = StepTracker(model)
    tracker.track_external(model, optimizer, *(t for t in tree_leaves(batch) if isinstance(t, Tensor)))
    baseline = tracker.live_bytes(device)
    cuda = device.type == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.synchronize(device)
        allocated_before = torch.cuda.memory_allocated(device)
        reset_peaks(device)
    with instrument("the memory tracker (MemTracker)"), tracker:
        step()
    peak = tracker.step_peak(device, baseline)
    if cuda:
        torch.cuda.synchronize(device)
        peak.cuda = {
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
            "baseline_allocated_bytes": int(allocated_before),
        }
    return peak
