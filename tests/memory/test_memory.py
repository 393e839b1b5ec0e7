"""Saved-activation counting and the warm-step memory check, against figures derived by hand.

The granularity fixture (tests/user_models/faults.py ``build_layers``) is 3 ``Layer``s of
width W=16 on a batch [B, S, W] = [2, 32, 16] float32, loss = mean((out - 0)²). What autograd
keeps, per layer, counting [B, S, W] tensors ("units", B·S·W·4 bytes):

* plain: LayerNorm 1 input (1) and its mean, rstd ([B, S, 1] each); Mix's Linear input
  cumsum/S (1; cumsum and division by a number keep nothing); LayerNorm 2 input (1) and its
  mean, rstd; Feed's up-projection input (1); ReLU's output (4), which is also the
  down-projection's input (one storage). 8 units + 4·B·S·4 bytes of statistics.
* recompute per layer: the layer input only (1).
* recompute per child (Mix, Feed, LayerNorm): the input of each child (4).
* the loss keeps ``out - target`` for ``square`` (1), outside every layer.
"""

from types import SimpleNamespace

import pytest
import torch
from conftest import compose_config, measured
from rows import fact_row
from torch import nn

from reportgen.checks.base.run import Run
from reportgen.checks.memory.check import (
    cuda_peak_rows,
    cuda_peaks,
    lost_gradient_rows,
    measure_saved,
    warm_step_memory,
)
from reportgen.checks.memory.rows import saved_rows, saving_share
from reportgen.commands.run import prepare
from reportgen.config import MEMORY
from reportgen.memory.saved import REST, saved_activation_bytes
from reportgen.results import Role, Status, judge
from reportgen.twins.step import TrainingStep

B, S, W, DEPTH = 2, 32, 16, 3
UNIT = B * S * W * 4  # bytes of one [B, S, W] float32 activation
STATS = B * S * 4  # bytes of one LayerNorm mean or rstd, [B, S, 1] float32


def granularity(*overrides):
    return prepare(compose_config("+model=granularity", f"parity.batch_size={B}", *overrides, user_conf=True))


def test_per_layer_recompute_keeps_each_layer_input_and_the_loss_difference():
    setup = granularity()
    assert tuple(setup.batch[0].shape) == (B, S, W)
    saved = measured(setup, recompute=True)
    assert saved.total_bytes == (DEPTH + 1) * UNIT
    assert saved.per_module == {"0": UNIT, "1": UNIT, "2": UNIT, REST: UNIT}
    assert saved.storages == DEPTH + 1


def test_per_child_recompute_keeps_every_child_input():
    setup = granularity("recompute.targets=[Mix,Feed,LayerNorm]")
    saved = measured(setup, recompute=True)
    assert saved.total_bytes == (4 * DEPTH + 1) * UNIT
    assert saved.per_module["1.norm2"] == UNIT and saved.per_module["1.feed"] == UNIT and saved.per_module[REST] == UNIT
    ratio = saved.total_bytes / measured(granularity(), recompute=True).total_bytes
    assert ratio == pytest.approx(13 / 4)


def test_plain_twin_keeps_eight_units_and_four_statistics_per_layer():
    setup = granularity()
    saved = measured(setup, recompute=False)
    per_layer = 8 * UNIT + 4 * STATS
    assert saved.total_bytes == DEPTH * per_layer + UNIT
    assert saved.per_module["0"] == per_layer and saved.per_module[REST] == UNIT
    assert saved.storages == DEPTH * 9 + 1  # x, cumsum/S, x1, LN2 out, ReLU out + 4 statistics; loss difference


def test_selective_mode_counts_the_op_outputs_the_policy_saves():
    # Layer recomputed, addmm outputs saved: Mix's Linear (1), up (4), down (1) per layer, plus the layer input.
    setup = granularity("recompute=selective", "recompute.save_ops=[aten.addmm]")
    saved = measured(setup, recompute=True)
    assert saved.total_bytes == DEPTH * (1 + 1 + 4 + 1) * UNIT + UNIT


class _ViewsAndWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((4, 6), 2.0))
        self.register_buffer("shift", torch.ones(4, 6))

    def forward(self, x):  # [4, 6]
        a = x.exp()  # keeps its output a
        return (a[:, :3].sin().sum() + a.sin().sum()) * 1.0 + (x * self.scale + self.shift).sum()


def test_views_are_one_storage_and_weights_are_not_activations():
    x = torch.randn(4, 6, requires_grad=True)
    saved = saved_activation_bytes(
        _ViewsAndWeights(), (x, torch.zeros(())), TrainingStep(SimpleNamespace(loss=lambda out, y: out)), None, []
    )
    # exp's output and the two sin inputs (a view of it and itself) share one storage; x is kept by
    # ``x * scale`` (the multiplication keeps both operands, but ``scale`` is a parameter).
    assert saved.total_bytes == 2 * 4 * 6 * 4 and saved.storages == 2
    assert saved.per_module == {REST: saved.total_bytes}


def test_counting_leaves_the_model_unchanged():
    setup = granularity("recompute=selective", "recompute.save_ops=[aten.addmm]")
    model = setup.build(recompute=True)
    before = {
        n: (len(m._forward_pre_hooks), len(m._forward_hooks), getattr(m, "checkpoint_fn", None))
        for n, m in model.named_modules()
    }
    saved_activation_bytes(model, setup.batch, setup.training_step, 0, [w.path for w in setup.wrapped])
    after = {
        n: (len(m._forward_pre_hooks), len(m._forward_hooks), getattr(m, "checkpoint_fn", None))
        for n, m in model.named_modules()
    }
    assert before == after


def test_a_tiny_target_gets_the_negligible_saving_warning():
    # Recomputing only the first LayerNorm drops just its mean and rstd: 2 * STATS bytes.
    setup = granularity("recompute.targets=[0.norm1]")
    rows = saved_rows(setup, *measure_saved(setup))
    saving = next(r for r in rows if r.role == Role.SAVING)
    assert saving.status == Status.WARN and "negligible saving" in saving.detail
    assert saving.extra["saving_bytes"] == 2 * STATS
    assert saving.value == pytest.approx(2 * STATS / (DEPTH * (8 * UNIT + 4 * STATS) + UNIT))


def test_a_whole_layer_target_passes_the_saving_threshold():
    setup = granularity()
    rows = saved_rows(setup, *measure_saved(setup))
    saving = next(r for r in rows if r.role == Role.SAVING)
    assert saving.status == Status.PASS
    plain_total = DEPTH * (8 * UNIT + 4 * STATS) + UNIT
    assert saving.extra["saving_bytes"] == plain_total - (DEPTH + 1) * UNIT
    modules = {(r.item, r.variant): r.value for r in rows if r.item.startswith("module ")}
    assert modules[("module 2", "recompute")] == UNIT and modules[(f"module {REST}", "plain")] == UNIT


@pytest.mark.parametrize(
    "plain, recompute, status",
    [(100, 96, Status.WARN), (100, 95, Status.PASS), (100, 120, Status.WARN), (0, 0, Status.WARN)],
)
def test_saving_status_threshold(plain, recompute, status):
    assert judge(saving_share(plain, recompute), ">=", 0.05, on_miss=Status.WARN) == status


def test_lost_gradients_make_the_saving_fail():
    """Reentrant recompute behind a frozen embedding: the adapters' 4 parameters get no gradient."""
    setup = prepare(compose_config("+model=frozen_input", "recompute=reentrant", user_conf=True))
    (row,) = lost_gradient_rows(setup)
    assert row.status == Status.FAIL and row.value == 4.0 and "not real" in row.detail
    setup = prepare(compose_config("+model=frozen_input", "recompute=non_reentrant", user_conf=True))
    assert lost_gradient_rows(setup)[0].status == Status.PASS


def test_without_cuda_the_peaks_are_not_measured_never_zero():
    setup = granularity("device=cpu")
    assert cuda_peaks(setup) == {}
    (row,) = cuda_peak_rows(setup, {})
    assert row.check == MEMORY and row.status == Status.INFO and row.value != row.value  # NaN, not 0
    assert row.detail.startswith("not measured")


@pytest.mark.gpu
def test_cuda_peaks_reserved_at_least_allocated_and_recompute_lower():
    setup = prepare(compose_config("+model=gpt", "device=cuda", "parity.batch_size=32"))
    rows = warm_step_memory(Run(setup))
    peak = {(r.variant, r.metric): r for r in rows if r.item == "CUDA step peak"}
    for variant in ("plain", "recompute"):
        allocated, reserved = peak[(variant, "peak_allocated_bytes")], peak[(variant, "peak_reserved_bytes")]
        assert reserved.value >= allocated.value > allocated.extra["baseline_allocated_bytes"] > 0
        assert allocated.extra["reserved_gap_bytes"] == reserved.value - allocated.value
    assert peak[("recompute", "peak_allocated_bytes")].value < peak[("plain", "peak_allocated_bytes")].value
    for row in (r for r in rows if r.item == "step peak"):  # one measurement: every row states the same figures
        assert row.extra["cuda_peak_allocated_bytes"] == peak[(row.variant, "peak_allocated_bytes")].value
        assert row.extra["cuda_peak_reserved_bytes"] == peak[(row.variant, "peak_reserved_bytes")].value


@pytest.mark.gpu
def test_saved_bytes_on_cuda_equal_the_cpu_count():
    """Per-layer recompute on CUDA keeps the same storages as on CPU (exact on any device)."""
    setup = granularity("device=cuda")
    assert measured(setup, recompute=True).total_bytes == (DEPTH + 1) * UNIT


def _render_section(rows):
    from reportgen.report.render import environment, view_model
    from reportgen.results import to_frame

    (section,) = [s for s in view_model(to_frame(rows), {}, "PASS", [])["sections"] if s["check"] == MEMORY]
    return environment().get_template(section["template"]).render(section=section, medium="html")


def test_memory_section_shows_cuda_peaks_with_the_reserved_sentence():
    setup = granularity()
    rows = saved_rows(setup, *measure_saved(setup))
    for variant, allocated, reserved in (("plain", 5 * 2**20, 8 * 2**20), ("recompute", 3 * 2**20, 8 * 2**20)):
        extra = {"baseline_allocated_bytes": 2**20, "reserved_gap_bytes": reserved - allocated, "warm_steps": 3}
        rows += [
            fact_row(MEMORY, "CUDA step peak", metric, value, variant=variant, extra=extra, role=Role.CUDA_PEAK)
            for metric, value in (("peak_allocated_bytes", allocated), ("peak_reserved_bytes", reserved))
        ]
    html = _render_section(rows)
    assert "Peak allocated" in html and "5.00 MiB" in html and "caching allocator" in html
    assert "3.00 MiB" in html and "not measured" not in html


def test_memory_section_on_cpu_says_not_measured_and_shows_no_zero_peaks():
    setup = granularity("device=cpu")
    rows = saved_rows(setup, *measure_saved(setup)) + cuda_peak_rows(setup, cuda_peaks(setup))
    html = _render_section(rows)
    assert "not measured: this run is on cpu" in html and "Peak allocated" not in html
