"""The task's own training step against reportgen's, side by side in one run, at a release size (issue 36, item 7).

The same model and fixed batch are measured twice by the warm-step memory and time checks' own functions:
once with reportgen's step (one forward, the loss, one backward) and once with a user step that accumulates
``MICRO`` micro-batches and clips the gradients' norm (the task gains ``forward_backward`` and ``before_step``).
Printed per step: each twin's saved-activation bytes, step peak (tracker, with the phase at the peak), the
memory check's seconds, and the time check's median step times and overhead ratio. Accumulation keeps one
micro-batch's activations alive at a time, so the user step's peak must be lower and its saved bytes (summed
over its forwards) about equal.

Usage (from the repository root; the default is the 113M-parameter Llama shape of conf/examples)::

    .venv/bin/python benchmarks/user_step.py
    .venv/bin/python benchmarks/user_step.py +model=gpt parity.batch_size=8
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch
from torch.utils._pytree import tree_map

sys.path[:0] = ["."]
from hydra import compose, initialize_config_dir

from reportgen.checks.base.run import Run
from reportgen.checks.memory.check import measure_peaks, measure_saved
from reportgen.checks.timing.check import warm_step_time
from reportgen.config import register_configs
from reportgen.memory.step_peak import format_bytes
from reportgen.paths import conf_dir
from reportgen.structure import call_model
from reportgen.twins.prepare import prepare
from reportgen.twins.step import training_step

MICRO = 2
DEFAULT = [
    "+model=hf_causal_lm",
    "model.config=conf/examples/hf_causal_lm_113m",
    "task.block_size=64",
    "parity.batch_size=4",
    "timing.max_measure_seconds=20",
]


class Accumulating:
    """The task, with its own step: ``MICRO`` micro-batches (tensor or dict inputs) and clipping to norm 1."""

    def __init__(self, task):
        self._task = task

    def __getattr__(self, name):
        return getattr(self._task, name)

    def forward_backward(self, model, batch):
        x, y = batch
        total = 0.0
        for i in range(MICRO):
            xs = tree_map(lambda t, i=i: t.chunk(MICRO)[i], x)
            loss = self._task.loss(call_model(model, xs), y.chunk(MICRO)[i]) / MICRO
            loss.backward()
            total += float(loss.detach())
        return torch.tensor(total)

    def before_step(self, model, optimizer):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def measure(setup) -> dict:
    """Saved bytes, step peaks and step times of both twins, with the memory check's and time check's functions."""
    start = time.perf_counter()
    saved, _ = measure_saved(setup)
    peaks, _ = measure_peaks(setup)
    memory_s = time.perf_counter() - start
    times = {
        r.metric + ":" + r.variant: r.value
        for r in warm_step_time(Run(setup))
        if "ms" in r.metric or "ratio" in r.metric
    }
    return {"saved": saved, "peaks": peaks, "memory_s": memory_s, "times": times}


def main() -> int:
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=sys.argv[1:] or DEFAULT)
    setup = prepare(cfg)
    params = sum(p.numel() for p in setup.template.module.parameters())
    print(f"model: {setup.architecture}, {params / 1e6:.1f}M parameters, batch {cfg.parity.batch_size}", flush=True)
    results = {"reportgen's step": measure(setup)}
    results[f"user step ({MICRO} micro-batches, clip)"] = measure(
        dataclasses.replace(setup, task=(task := Accumulating(setup.task)), training_step=training_step(task))
    )
    for name, got in results.items():
        print(f"== {name}: memory check functions {got['memory_s']:.1f} s")
        for variant in ("plain", "recompute"):
            peak = got["peaks"][variant]
            print(
                f"  {variant:<9} saved {format_bytes(got['saved'][variant].total_bytes):>11}  "
                f"step peak {format_bytes(peak.peak_bytes):>11} in {peak.phase}"
            )
        print("  times:", {k: round(float(v), 3) for k, v in got["times"].items()})
    (own, user) = results.values()
    for variant in ("plain", "recompute"):
        ratio = user["peaks"][variant].peak_bytes / own["peaks"][variant].peak_bytes
        print(f"step peak, user step / reportgen's step, {variant}: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
