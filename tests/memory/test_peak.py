"""The memory verdict is the step's peak (tests/user_models/peak.py; figures derived below).

``peak_stack``: 6 residual layers of width W=16 in one ``Stack`` on [B, 8] inputs, B=128.
One region around the stack keeps almost nothing after the forward, but backward recomputes
all 6 layers at once: the peak is exactly the plain twin's. One region per layer lowers it.

``peak_relu``: Linear(8, 32), then 5 x (RecomputedReLU, Linear), B=256. Each wrapped ReLU keeps
its input [B, 32] for the recompute while the next Linear still keeps its output, so recompute
keeps 5 more [B, 32] float32 tensors (160 KiB) than the plain twin, and the peak rises by as much.
"""

from types import SimpleNamespace

import pytest
import torch
from conftest import compose_config

from reportgen.checks.base.run import Run
from reportgen.checks.memory.check import measure_peaks, measure_saved, warm_step_memory
from reportgen.checks.memory.rows import peak_rows, saved_rows
from reportgen.commands.run import prepare
from reportgen.config import MEMORY
from reportgen.memory.peak import warm_step_peak
from reportgen.memory.step_peak import CATEGORIES, OUTSIDE, format_bytes
from reportgen.results import Role, Status, judge_record
from reportgen.twins.step import TrainingStep
from reportgen.twins.twin import TrainStep, Twin

RELU_B, RELU_W, RELUS = 256, 32, 5


def stack(*overrides):
    return prepare(compose_config("+model=peak_stack", "device=cpu", *overrides, user_conf=True))


def memory_rows(setup):
    peaks = measure_peaks(setup)
    saved = measure_saved(setup)
    return peaks[0], saved_rows(setup, *saved) + peak_rows(setup, *peaks, saved[0])


def verdict_row(rows):
    (row,) = [r for r in rows if r.role == Role.PEAK_SAVING]
    return row


def test_one_region_around_the_whole_stack_leaves_the_peak_where_it_was():
    setup = stack()
    peaks, rows = memory_rows(setup)
    saving = next(r for r in rows if r.role == Role.SAVING)
    assert saving.status == Status.PASS and saving.value > 0.9  # the saved bytes alone would pass the claim
    plain, rec = peaks["plain"], peaks["recompute"]
    assert rec.peak_bytes == plain.peak_bytes  # backward recomputes all 6 layers at once
    assert rec.phase == "backward" and rec.largest_region()[0] == "body"
    assert rec.categories["recomputed activations"] > rec.categories["saved activations"]
    row = verdict_row(rows)
    assert row.status == Status.WARN and row.value == 0.0 and row.metric == "peak_saving_share"
    assert "one region (body) holds 9" in row.detail and "split it (e.g. one region per layer)" in row.detail
    assert "does not lower the step's peak" in row.detail


def test_peak_on_miss_fail_makes_the_whole_stack_region_fail_the_memory_check():
    setup = stack("memory.peak_on_miss=FAIL")
    row = verdict_row(memory_rows(setup)[1])
    assert row.status == Status.FAIL
    assert judge_record(row.record()) == Status.FAIL  # reportgen.verify re-judges it from its numbers
    from reportgen.report.diagnose import diagnose

    (why,) = diagnose([row], {})
    assert why.extra["rule"] == "region recomputed whole" and "one region per layer" in why.detail


def test_one_region_per_layer_lowers_the_peak_and_passes():
    setup = stack("recompute.targets=[Layer]", "memory.peak_on_miss=FAIL")
    peaks, rows = memory_rows(setup)
    plain, rec = peaks["plain"], peaks["recompute"]
    row = verdict_row(rows)
    assert row.status == Status.PASS and row.value == pytest.approx(1 - rec.peak_bytes / plain.peak_bytes)
    assert row.value > 0.4 and row.extra["peak_saving_bytes"] == plain.peak_bytes - rec.peak_bytes
    # at most one layer's activations come back at a time
    region, recomputed = rec.largest_region()
    assert region.startswith("body.layers.") and recomputed < peaks["plain"].categories["saved activations"] / 5


def test_relu_only_target_is_an_increase_charged_to_the_relus():
    setup = prepare(compose_config("+model=peak_relu", "device=cpu", user_conf=True))
    peaks, rows = memory_rows(setup)
    extra = RELUS * RELU_B * RELU_W * 4  # one [B, 32] float32 input per wrapped ReLU
    saving = next(r for r in rows if r.role == Role.SAVING)
    assert saving.extra["saving_bytes"] == -extra and saving.status == Status.WARN
    share = extra / saving.extra["plain_bytes"]
    assert saving.detail.startswith(f"+{share:.1%}: recompute costs memory here")
    assert "(RecomputedReLU)" in saving.detail and "rest of model" not in saving.detail
    assert peaks["recompute"].peak_bytes - peaks["plain"].peak_bytes == extra
    row = verdict_row(rows)
    assert row.status == Status.WARN and row.value == pytest.approx(-extra / peaks["plain"].peak_bytes)
    assert row.detail.startswith(f"+{extra / peaks['plain'].peak_bytes:.1%}: recompute costs memory here")
    assert "1 (RecomputedReLU), 3 (RecomputedReLU)" in row.detail and format_bytes(extra) in row.detail
    # per module: each ReLU's own count is unchanged; its output, kept by the next Linear, is charged to it
    modules = {(r.extra["module"], r.variant): r for r in rows if r.role == Role.SAVED_MODULE}
    assert modules[("1", "recompute")].extra["produced_saved_bytes"] == RELU_B * RELU_W * 4
    assert modules[("1", "plain")].extra["produced_saved_bytes"] == 0


def test_both_twins_report_their_peak_with_phase_module_and_categories_on_cpu():
    setup = stack()
    rows = warm_step_memory(Run(setup))
    peaks = {r.variant: r for r in rows if r.role == Role.STEP_PEAK}
    assert set(peaks) == {"plain", "recompute"}
    model = setup.build(False)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    tensors = len(list(model.parameters()))
    batch_bytes = sum(t.numel() * t.element_size() for t in setup.batch)
    for row in peaks.values():
        assert row.status == Status.INFO and row.check == MEMORY and row.unit == "B"
        assert row.extra["peak_phase"] == "backward" and row.extra["peak_module"].startswith("body.layers.5.ff")
        parts = [row.extra[f"at_peak_{c.replace(' ', '_')}_bytes"] for c in CATEGORIES]
        assert sum(parts) == row.value
        assert row.extra["at_peak_parameters_bytes"] == param_bytes
        # AdamW: exp_avg and exp_avg_sq per parameter, and a float32 step counter per parameter tensor
        assert row.extra["at_peak_optimizer_state_bytes"] == 2 * param_bytes + 4 * tensors
        assert row.extra["baseline_bytes"] == param_bytes + 2 * param_bytes + 4 * tensors + batch_bytes
        assert row.value > row.extra["baseline_bytes"]
        assert "cuda_peak_allocated_bytes" not in row.extra  # CPU: no allocator figure, never a zero


def test_a_tiny_model_peaks_in_the_optimizer_step_and_the_row_says_so():
    """ffn on [3, 12]: weights, gradients and AdamW state set the peak; no activation is alive then."""
    setup = prepare(compose_config("+model=ffn", "device=cpu"))
    peaks, rows = memory_rows(setup)
    assert {p.phase for p in peaks.values()} == {"optimizer step"}
    assert {p.module for p in peaks.values()} == {OUTSIDE}
    row = verdict_row(rows)
    assert row.status == Status.WARN and "both peaks are in the optimizer step" in row.detail


def test_the_tracker_counts_a_view_once_and_sees_what_backward_frees():
    """One Linear(4, 8) without bias on x [16, 4]; the loss is ``(y.view(-1) ** 2).sum()``."""
    model = torch.nn.Linear(4, 8, bias=False)
    x, target = torch.randn(16, 4), torch.zeros(())
    task = SimpleNamespace(loss=lambda out, y: out.view(-1).square().sum())
    twin = Twin.of(model, TrainingStep(task), {"_target_": "torch.optim.SGD", "lr": 0.1})
    peak = warm_step_peak(TrainStep(twin, (x, target)))
    weight, out, batch = 8 * 4 * 4, 16 * 8 * 4, 16 * 4 * 4 + 4  # the 0-dim target is 4 bytes
    assert peak.categories["parameters"] == weight and peak.categories["batch"] == batch
    assert peak.baseline_bytes == weight + batch  # SGD without momentum keeps no state
    # square keeps its input, a view of the Linear's output: one storage, counted once
    assert peak.phase == "backward" and peak.categories["saved activations"] == out
    assert peak.peak_bytes == sum(peak.categories.values()) > peak.baseline_bytes + out


@pytest.mark.parametrize(
    "setting, value",
    [("memory.min_peak_saving_share", "0"), ("memory.min_peak_saving_share", "1.5"), ("memory.peak_on_miss", "ERROR")],
)
def test_bad_peak_settings_are_refused_with_their_name(setting, value):
    from reportgen.commands.validation import config_problems

    problems = config_problems(compose_config("+model=ffn", f"{setting}={value}"))
    assert setting in problems


def test_memory_section_shows_both_peaks_and_the_verdict():
    from reportgen.checks.memory.estimate import estimate_rows
    from reportgen.report.render import environment, view_model
    from reportgen.results import to_frame

    setup = stack()
    peaks, rows = memory_rows(setup)
    rows += estimate_rows(setup, None, peaks)
    (section,) = [s for s in view_model(to_frame(rows), {}, "PASS", [])["sections"] if s["check"] == MEMORY]
    html = environment().get_template(section["template"]).render(section=section, medium="html")
    assert "Step peak" in html and "body.layers.5.ff" in html and "split it" in html
    assert html.count("backward") >= 2 and "saved activations" in html
    assert "Step peak, estimated on fake tensors" in html and "measured shape" in html
    assert f"estimated step peak {format_bytes(peaks['plain'].peak_bytes)}, measured" in html


@pytest.mark.gpu
def test_on_cuda_the_allocator_peaks_of_the_same_step_sit_beside_the_tracker():
    """The allocator rounds every block up and never holds less than the live tensors, so its
    allocated peak is at least the tracker's, and reserved at least allocated."""
    setup = prepare(compose_config("+model=peak_stack", "device=cuda", "recompute.targets=[Layer]", user_conf=True))
    peaks, rows = memory_rows(setup)
    for variant, peak in peaks.items():
        assert peak.device.startswith("cuda") and peak.cuda is not None
        assert peak.cuda["peak_reserved_bytes"] >= peak.cuda["peak_allocated_bytes"] >= peak.peak_bytes
        row = next(r for r in rows if r.role == Role.STEP_PEAK and r.variant == variant)
        assert 0 < row.extra["tracker_to_allocated_ratio"] <= 1 and "max_memory_allocated" in row.detail
    assert verdict_row(rows).status == Status.PASS
    assert peaks["recompute"].cuda["peak_allocated_bytes"] < peaks["plain"].cuda["peak_allocated_bytes"]


@pytest.mark.parametrize("model", ["ffn", "mlp"])
def test_the_estimated_step_peak_equals_the_measured_one_at_the_measured_shape(model):
    """Fake tensors, the same tracker: the estimate may differ from the measurement only by shape."""
    from reportgen.checks.memory.estimate import estimate_rows

    setup = prepare(compose_config(f"+model={model}", "device=cpu"))
    peaks, _ = measure_peaks(setup)
    rows = [r for r in estimate_rows(setup, None, peaks) if r.role == Role.ESTIMATE_PEAK]
    checks = {r.variant: r for r in rows if r.metric == "estimated_peak_rel_diff"}
    estimates = {r.variant: r for r in rows if r.metric == "estimated_peak_live_bytes"}
    assert set(checks) == set(estimates) == {"plain", "recompute"}
    for variant, row in checks.items():
        assert row.status == Status.PASS and row.value <= 0.01
        assert abs(estimates[variant].value - peaks[variant].peak_bytes) <= 0.01 * peaks[variant].peak_bytes
        assert estimates[variant].extra["peak_phase"] == peaks[variant].phase


@pytest.mark.parametrize(
    "model", ["gpt", pytest.param("hf_gpt2", marks=pytest.mark.hf), pytest.param("hf_llama", marks=pytest.mark.hf)]
)
def test_the_estimated_step_peak_of_transformers_equals_the_measurement(model):
    from reportgen.memory.estimate import estimate_saved_activations

    # one untracked warm step (warm_step_peak's own default) initialises the optimizer state as three do
    setup = prepare(compose_config(f"+model={model}", "device=cpu", "memory.warm_steps=1"))
    peaks, _ = measure_peaks(setup)
    est = estimate_saved_activations(setup, {})
    for variant in ("plain", "recompute"):
        estimated, measured = getattr(est, f"{variant}_peak"), peaks[variant]
        assert abs(estimated.peak_bytes - measured.peak_bytes) <= 0.01 * measured.peak_bytes
        assert (estimated.phase, estimated.module) == (measured.phase, measured.module)
    assert est.recompute_peak.peak_bytes < est.plain_peak.peak_bytes


def test_the_target_shape_estimate_reports_the_peak_of_both_twins():
    """peak_stack at batch 512 on fake tensors: one region per layer lowers the estimated peak."""
    from reportgen.memory.estimate import estimate_saved_activations

    setup = stack("recompute.targets=[Layer]")
    est = estimate_saved_activations(setup, {"batch_size": 512})
    assert est.peak_error == "" and est.inputs == "[512, 8] float32"
    assert est.recompute_peak.peak_bytes < est.plain_peak.peak_bytes
    small = estimate_saved_activations(setup, {})
    # activations grow 4x with the batch, weights and optimizer state do not
    grown = est.plain_peak.categories["saved activations"]
    assert grown == 4 * small.plain_peak.categories["saved activations"]
    assert est.plain_peak.categories["parameters"] == small.plain_peak.categories["parameters"]


def test_the_cuda_figures_of_the_same_step_are_stated_beside_the_peak():
    """The CUDA branch of the rows, on CPU: a StepPeak as warm_step_peak returns it on CUDA."""
    import dataclasses

    from reportgen.report.render import environment, view_model
    from reportgen.results import to_frame

    setup = stack("recompute.targets=[Layer]")
    peaks, seconds = measure_peaks(setup)
    cuda = {}
    for variant, peak in peaks.items():
        figures = {
            "peak_allocated_bytes": peak.peak_bytes + 4096,
            "peak_reserved_bytes": 4 * 2**20,
            "baseline_allocated_bytes": peak.baseline_bytes,
        }
        cuda[variant] = dataclasses.replace(peak, device="cuda:0", cuda=figures)
    rows = peak_rows(setup, cuda, seconds, None)
    for variant, row in ((r.variant, r) for r in rows if r.role == Role.STEP_PEAK):
        allocated = cuda[variant].peak_bytes + 4096
        assert (
            row.extra["cuda_peak_allocated_bytes"] == allocated and row.extra["cuda_peak_reserved_bytes"] == 4 * 2**20
        )
        assert row.extra["tracker_to_allocated_ratio"] == pytest.approx(cuda[variant].peak_bytes / allocated)
        assert f"max_memory_allocated in the same step: {format_bytes(allocated)}" in row.detail
        assert f"tracker / allocator = {cuda[variant].peak_bytes / allocated:.3f}" in row.detail
    (section,) = [s for s in view_model(to_frame(rows), {}, "PASS", [])["sections"] if s["check"] == MEMORY]
    html = environment().get_template(section["template"]).render(section=section, medium="html")
    assert html.count("<code>max_memory_reserved</code> 4.00 MiB") == 2


def test_frozen_parameters_are_tracked_without_gradient_hooks():
    """torch's MemTracker registers a gradient hook on every parameter and raises on a frozen one;
    a frozen embedding (or LoRA's frozen base) must still get a step peak."""
    import torch
    from torch import nn

    from reportgen.memory.peak import warm_step_peak

    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8))
    model[0].requires_grad_(False)
    ids = torch.randint(0, 10, (4, 3))
    task = SimpleNamespace(loss=lambda out, y: (out - y).square().mean())
    twin = Twin.of(model.train(), TrainingStep(task), {"_target_": "torch.optim.SGD", "lr": 0.1})
    peak = warm_step_peak(TrainStep(twin, (ids, torch.zeros(4, 3, 8)), 0), 1)
    assert peak.peak_bytes > 0 and peak.categories["gradients"] <= 8 * 8 * 4 + 8 * 4  # the Linear's only
