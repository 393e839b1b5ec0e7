"""Harness overhead: wall time of one full report vs the bare model work it performs.

Runs the whole pipeline once (``reportgen.commands.run.run``, every check, HTML and PDF) and, in the
same run, times the model work inside it: top-level module forwards (outside backward),
``torch.autograd.backward`` calls (which include any recomputation) and optimizer steps,
through global module hooks, a wrapper around ``torch.autograd.backward`` and global
optimizer step hooks. The ratio wall / model work is what the harness costs on top of the
training-like work it has to do. Also prints each check's wall time and, from the results
frame, the timing check's overhead ratio and its 95% CI half-width, and a per-phase breakdown
(``phases_s``: each stage of the pipeline, each check and the report's parts, as
``[wall, model work inside it, CPU of this process]`` seconds), so what the harness adds can be found by name.

Usage (from the repository root)::

    .venv/bin/python benchmarks/harness_overhead.py                 # +model=gpt
    .venv/bin/python benchmarks/harness_overhead.py +model=mlp report.pdf=false
    .venv/bin/python benchmarks/harness_overhead.py +model=hf_causal_lm \
        model.config=conf/examples/hf_causal_lm_113m task.block_size=32 parity.batch_size=2 report.sign=false

Also printed: ``peak_rss_gib`` (this process's peak resident set, ``getrusage``), ``twin_state_gib``
(one twin's training state: weights, gradients and two AdamW moments, 4 × the parameter bytes) and
``factory_calls`` (how often the model's factory ran: 1, reportgen.twins.template).

The hooks themselves add a little to the model-work figure, so the ratio is a lower bound. On a
shared machine wall time depends on what else runs; ``cpu_over_model_work_cpu`` is the same ratio
in this process's CPU seconds (child processes included), which load moves much less.
Work under ``FakeTensorMode`` (the GPU-free memory estimate runs the model on fake tensors:
shapes only, no arithmetic) is the harness's own, not model work, and is not counted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reportgen.checks.memory import estimate as memory_estimate
from reportgen.commands import run as pipeline
from reportgen.config import TIME, register_configs
from reportgen.paths import conf_dir
from reportgen.report import render
from reportgen.results import frame_from_json


def faking() -> bool:
    """Inside ``FakeTensorMode``: tensors have shapes but no values, so nothing is computed."""
    return any(isinstance(mode, FakeTensorMode) for mode in _get_current_dispatch_mode_stack())


class ModelWork:
    """Seconds spent in top-level forwards, backward calls and optimizer steps (on real tensors)."""

    def __init__(self):
        self.seconds = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        self.cpu_seconds = 0.0  # this process's CPU inside the same regions
        self.calls = {"forward": 0, "backward": 0, "optimizer": 0}
        self._depth = 0
        self._in_backward = 0
        self._start = {}

    def pre_forward(self, module, args):
        if self._in_backward or faking():
            return
        if self._depth == 0:
            self._start["forward"] = time.perf_counter(), time.process_time()
        self._depth += 1

    def post_forward(self, module, args, output):
        if self._in_backward or faking():
            return
        self._depth -= 1
        if self._depth == 0:
            self._add("forward")

    def _add(self, kind: str):
        wall, cpu = self._start.pop(kind)
        self.seconds[kind] += time.perf_counter() - wall
        self.cpu_seconds += time.process_time() - cpu
        self.calls[kind] += 1

    def wrap_backward(self, backward):
        def timed_backward(*args, **kwargs):
            if faking():
                return backward(*args, **kwargs)
            self._in_backward += 1
            start, cpu = time.perf_counter(), time.process_time()
            try:
                return backward(*args, **kwargs)
            finally:
                self._in_backward -= 1
                self.seconds["backward"] += time.perf_counter() - start
                self.cpu_seconds += time.process_time() - cpu
                self.calls["backward"] += 1

        return timed_backward

    def total(self) -> float:
        """Model work so far, seconds."""
        return sum(self.seconds.values())

    def pre_step(self, optimizer, args, kwargs):
        if not faking():
            self._start["optimizer"] = time.perf_counter(), time.process_time()

    def post_step(self, optimizer, args, kwargs):
        if "optimizer" in self._start:
            self._add("optimizer")


#: The pipeline's stages (names in ``reportgen.commands.run``) and the report's parts (names in
#: ``reportgen.report.render``) timed one by one; the checks are timed through the registry.
STAGES = (
    "prepare",
    "run_metadata",
    "run_checks",
    "observation_rows",
    "diagnose",
    "judge_claim",
    "write_results",
    "mark_pending",
    "render_report",
    "write_ci_outputs",
    "sign_run",
    "finish_ci_outputs",
)
REPORT_PARTS = ("section_plots", "write_pdf")


class Phases:
    """Wall and model-work seconds per named phase: wraps functions by name for one run."""

    def __init__(self, work: ModelWork):
        self.work = work
        self.seconds: dict[str, list[float]] = {}
        self._undo: list[tuple[object, str, object]] = []

    def timed(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            wall, model, cpu = time.perf_counter(), self.work.total(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = self.seconds.setdefault(name, [0.0, 0.0, 0.0])
                spent[0] += time.perf_counter() - wall
                spent[1] += self.work.total() - model
                spent[2] += time.process_time() - cpu

        return wrapper

    def wrap(self, module, attr: str, name: str | None = None) -> None:
        original = getattr(module, attr)
        self._undo.append((module, attr, original))
        setattr(module, attr, self.timed(name or attr, original))

    def install(self) -> None:
        for stage in STAGES:
            self.wrap(pipeline, stage)
        for part in REPORT_PARTS:
            self.wrap(render, part, f"render_report: {part}")
        self.wrap(memory_estimate, "estimate_or_reason", "check: warm-step memory: estimate on fake tensors")
        registry = [dataclasses.replace(c, run=self.timed(f"check: {c.name}", c.run)) for c in pipeline.REGISTRY]
        self._undo.append((pipeline, "REGISTRY", pipeline.REGISTRY))
        pipeline.REGISTRY = registry

    def remove(self) -> None:
        for module, attr, original in reversed(self._undo):
            setattr(module, attr, original)

    def table(self) -> dict[str, list[float]]:
        return {name: [round(v, 2) for v in spent] for name, spent in self.seconds.items()}


def capture_estimate() -> dict:
    """Keep the total of the run's pre-check estimate (``reportgen.commands.run.refuse_long_runs``' result), s."""
    kept: dict = {"s": None}
    original = pipeline.refuse_long_runs

    def kept_estimate(setup):
        est = original(setup)
        kept["s"] = None if est is None else round(sum(est.phases.values()), 2)
        return est

    pipeline.refuse_long_runs = kept_estimate
    return kept


def count_factory_calls() -> dict:
    """Count the calls of the pipeline's one model build (``reportgen.twins.setup._instantiate_model``)."""
    from reportgen.twins import setup as twins_setup

    calls: dict = {"n": 0, "param_bytes": 0}
    original = twins_setup._instantiate_model

    def counted(*args, **kwargs):
        calls["n"] += 1
        template, probe = original(*args, **kwargs)
        calls["param_bytes"] = sum(p.numel() * p.element_size() for p in template.module.parameters())
        return template, probe

    twins_setup._instantiate_model = counted
    return calls


def _children_cpu() -> float:
    """CPU seconds of this process's ended child processes (user + system)."""
    times = os.times()
    return times.children_user + times.children_system


def main(overrides: list[str], json_path: str | None = None, config_dir: str | None = None) -> dict:
    """Run one report with ``overrides`` (``config_dir``: an extra config folder, as ``--config-dir``
    adds one, e.g. a plan's output); return the timings (printed as JSON, and written to ``json_path``)."""
    register_configs()
    extra = [f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"] if config_dir else []
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        cfg = compose("config", overrides=[*extra, *(overrides or ["+model=gpt", "report.sign=false"])])
    work = ModelWork()
    handles = [
        register_module_forward_pre_hook(work.pre_forward),
        register_module_forward_hook(work.post_forward, always_call=True),
        register_optimizer_step_pre_hook(work.pre_step),
        register_optimizer_step_post_hook(work.post_step),
    ]
    original = torch.autograd.backward
    torch.autograd.backward = work.wrap_backward(original)
    phases = Phases(work)
    phases.install()
    calls = count_factory_calls()
    estimate = capture_estimate()
    out_dir = Path(tempfile.mkdtemp(prefix="reportgen-bench-"))
    try:
        start, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
        code = pipeline.run(cfg, out_dir)
        wall, cpu, children = time.perf_counter() - start, time.process_time() - cpu, _children_cpu() - children
    finally:
        torch.autograd.backward = original
        phases.remove()
        for handle in handles:
            handle.remove()
    frame = frame_from_json((out_dir / "results.json").read_text())
    per_check = frame.groupby("check", sort=False).seconds.sum().round(2).to_dict()
    overhead = frame[(frame.check == TIME) & (frame.metric == "overhead_ratio")]
    model_s = sum(work.seconds.values())
    params = calls["param_bytes"]
    result = {
        "factory_calls": calls["n"],
        # the run's own pre-check estimate of its wall (reportgen.training.duration), and its ratio to the wall
        "estimate_s": estimate["s"],
        "estimate_over_wall": round(estimate["s"] / wall, 2) if estimate["s"] else None,
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "twin_state_gib": round(4 * params / 2**30, 2),
        "overrides": overrides,
        "exit_code": code,
        "wall_s": round(wall, 2),
        "model_work_s": round(model_s, 2),
        "cpu_s": round(cpu, 2),  # this process's CPU over the wall (with several cores it may exceed it)
        "children_cpu_s": round(children, 2),  # child processes, once ended
        "model_work_cpu_s": round(work.cpu_seconds, 2),
        # the same ratio in CPU seconds: steadier than wall on a shared machine, where both parts wait their turn
        "cpu_over_model_work_cpu": round((cpu + children) / work.cpu_seconds, 2) if work.cpu_seconds else None,
        "wall_over_model_work": round(wall / model_s, 2) if model_s else None,
        "model_work_parts_s": {k: round(v, 2) for k, v in work.seconds.items()},
        "calls": work.calls,
        "check_seconds_from_rows": per_check,
        "phases_s": phases.table(),
        "outside_model_work_s": round(wall - model_s, 2),
        "torch_threads": torch.get_num_threads(),
        "overhead_ratio": None if overhead.empty else round(float(overhead.value.iloc[0]), 4),
        "overhead_ci": None
        if overhead.empty
        else [round(float(overhead.ci_low.iloc[0]), 4), round(float(overhead.ci_high.iloc[0]), 4)],
        "ci_half_width_pp": None if overhead.empty else round(float(overhead.ci_half_width_pp.iloc[0]), 2),
        "out_dir": str(out_dir),
        # the whole run's CUDA peaks (every twin, every check), GiB: [max_memory_allocated, max_memory_reserved]
        "cuda_run_peak_gib": run_peak_gib(),
    }
    print(json.dumps(result, indent=1))
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=1))
    return result


def run_peak_gib() -> list[float] | None:
    """The process's CUDA peaks across the run, GiB, or None without CUDA
    (reportgen.memory.device_peak.run_device_peak: kept across the checks' own peak resets)."""
    from reportgen.memory.device_peak import run_device_peak

    peak = run_device_peak()
    return None if peak is None else [round(peak[0] / 2**30, 2), round(peak[1] / 2**30, 2)]


if __name__ == "__main__":
    args, flags = sys.argv[1:], {}
    while args and args[0] in ("--json", "--config-dir"):
        flags[args[0]], args = args[1], args[2:]
    main(args, flags.get("--json"), flags.get("--config-dir"))
