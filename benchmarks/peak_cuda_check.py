"""Device check (issue 15): the tracker's step peak beside torch.cuda's allocator peaks of the same step.

    python benchmarks/peak_cuda_check.py          # on a CUDA machine, from the repository root
    DEV=cpu python benchmarks/peak_cuda_check.py  # dry run of the same code on CPU

Needs torch with CUDA, hydra-core and omegaconf (reportgen.memory.peak imports hydra.utils); set
PYTHONPATH to a folder holding them if the machine lacks them. For tests/user_models/peak.py's
6-layer stack (plain, one region around the stack, one region per layer) at two sizes and the
ReLU-only model it prints tracker peak, max_memory_allocated, max_memory_reserved, their ratio
and where the peak was reached, and exits 1 unless reserved >= allocated >= tracker for every run
(the allocator rounds blocks up and never holds less than the live tensors).
"""

import gc
import os
import sys
import time
from types import SimpleNamespace

sys.path[:0] = [".", "tests"]
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from user_models import peak as pm

from reportgen.memory.peak import warm_step_peak
from reportgen.memory.step_peak import format_bytes
from reportgen.twins.step import TrainingStep
from reportgen.twins.twin import TrainStep, Twin

dev = torch.device(os.environ.get("DEV", "cuda"))
print("torch", torch.__version__, torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", flush=True)
opt = {"_target_": "torch.optim.AdamW", "lr": 1e-3}
fails = []


def run(name, model, batch, loss):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    t = time.perf_counter()
    twin = Twin.of(model.to(dev).train(), TrainingStep(SimpleNamespace(loss=loss)), opt)
    p = warm_step_peak(TrainStep(twin, tuple(b.to(dev) for b in batch), 0), 2)
    c = p.cuda or {
        "peak_allocated_bytes": p.peak_bytes,
        "peak_reserved_bytes": p.peak_bytes,
        "baseline_allocated_bytes": p.baseline_bytes,
    }
    step_tr, step_al = p.peak_bytes - p.baseline_bytes, c["peak_allocated_bytes"] - c["baseline_allocated_bytes"]
    print(
        f"{name}: tracker {p.peak_bytes} ({format_bytes(p.peak_bytes)}) allocated {c['peak_allocated_bytes']} "
        f"reserved {c['peak_reserved_bytes']} ratio {p.peak_bytes / c['peak_allocated_bytes']:.4f} "
        f"step-increase ratio {step_tr / step_al:.4f} baselines {p.baseline_bytes}/{c['baseline_allocated_bytes']} "
        f"| {p.phase} {p.module} {p.region} {p.largest_region()} {round(time.perf_counter() - t, 2)}s",
        flush=True,
    )
    print("   ", {k: v for k, v in p.categories.items() if v}, flush=True)
    if not c["peak_reserved_bytes"] >= c["peak_allocated_bytes"] >= p.peak_bytes:
        fails.append(name)
    return p


for b, width in ((128, 16), (4096, 256)) if dev.type == "cuda" else ((128, 16),):
    res = {}
    for wrap in ("plain", "whole", "layer"):
        torch.manual_seed(0)
        m = pm.build_stack(width)
        if wrap == "whole":
            m.body = checkpoint_wrapper(m.body)
        if wrap == "layer":
            for i in range(len(m.body.layers)):
                m.body.layers[i] = checkpoint_wrapper(m.body.layers[i])
        res[wrap] = run(
            f"stack b={b} w={width} {wrap}", m, pm.batch_regression(torch.Generator().manual_seed(0), b), pm.mse
        )
    print(
        "  whole/plain",
        res["whole"].peak_bytes / res["plain"].peak_bytes,
        "layer/plain",
        res["layer"].peak_bytes / res["plain"].peak_bytes,
    )
for wrap in (False, True):
    torch.manual_seed(0)
    m = pm.build_relus(256 if dev.type == "cuda" else 32)
    if wrap:
        for i, c in enumerate(m):
            if isinstance(c, pm.RecomputedReLU):
                m[i] = checkpoint_wrapper(c)
    run(
        f"relu b=4096 w=256 wrapped={wrap}",
        m,
        pm.batch_classes(torch.Generator().manual_seed(0), 4096),
        pm.cross_entropy,
    )
print("FAILS", fails)
sys.exit(1 if fails else 0)
