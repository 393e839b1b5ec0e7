"""The GPU-free estimate: equal to the measurement at the measured shape, exact at a target shape,
and the per-layer figure of reportgen's gpt against Korthikanti et al. 2022 term by term."""

import resource

import pytest
from conftest import compose_config

from reportgen.checks.memory.check import measure_saved
from reportgen.checks.memory.estimate import estimate_rows
from reportgen.commands.run import prepare
from reportgen.memory.estimate import (
    EstimateConfigError,
    TransformerShape,
    estimate_saved_activations,
    validate_overrides,
)
from reportgen.memory.saved import REST
from reportgen.results import Status


def test_estimate_equals_measurement_at_the_measured_shape_on_gpt():
    setup = prepare(compose_config("+model=gpt"))
    saved, _ = measure_saved(setup)
    rows = [r for r in estimate_rows(setup, saved) if r.item == "estimate at measured shape"]
    assert {r.variant for r in rows} == {"plain", "recompute"}
    for row in rows:
        assert row.status == Status.PASS and row.value == saved[row.variant].total_bytes
        assert row.extra["estimate_to_measured_ratio"] == 1.0


def test_target_shape_of_the_granularity_stack_is_exact():
    """5 layers, batch [7, 32, 16]: per-layer recompute keeps 5 layer inputs + the loss difference."""
    setup = prepare(compose_config("+model=granularity", user_conf=True))
    est = estimate_saved_activations(setup, {"model": {"depth": 5}, "batch_size": 7})
    unit = 7 * 32 * 16 * 4
    assert est.inputs == "[7, 32, 16] float32"
    assert est.recompute.total_bytes == 6 * unit
    assert est.plain.total_bytes == 5 * (8 * unit + 4 * 7 * 32 * 4) + unit
    assert est.transformer is None  # no attention heads: no Korthikanti comparison


@pytest.fixture(scope="module")
def gpt_cpu():
    """The built-in gpt's setup on CPU, prepared once: the estimates below read it, none changes it."""
    return prepare(compose_config("+model=gpt", "device=cpu"))


def _gpt_target(setup, **shape):
    over = {
        "model": {k: shape[k] for k in ("width", "depth", "heads")},
        "task": {"block_size": shape["s"]},
        "batch_size": shape["b"],
    }
    return setup, estimate_saved_activations(setup, over)


#: The small gpt target shape of the two Korthikanti tests (s, b, h, a).
S, B, H, A = 48, 3, 64, 2


@pytest.fixture(scope="module")
def small_gpt_target(gpt_cpu):
    """``(setup, estimate)`` at :data:`S`, :data:`B`, :data:`H`, :data:`A`, 2 layers, estimated once for both tests."""
    return _gpt_target(gpt_cpu, width=H, depth=2, heads=A, s=S, b=B)


def test_gpt_layer_matches_korthikanti_with_float32_values_float_masks_and_layernorm_statistics(small_gpt_target):
    """On CPU in float32, reportgen's gpt layer keeps exactly sbh(16e + 2m) + as²b(2e + m) with e = m = 4
    (CPU dropout keeps a float mask), plus 2 LayerNorms × (mean, rstd) × b·s × 4 bytes."""
    s, b, h, a = S, B, H, A
    _, est = small_gpt_target
    shape = est.transformer
    assert (shape.s, shape.b, shape.h, shape.a, shape.element_bytes) == (s, b, h, a, 4)
    sbh, as2b = s * b * h, a * s * s * b
    assert est.per_layer("plain") == sbh * 72 + as2b * 12 + 2 * 2 * b * s * 4
    assert shape.formula_bytes(4, 4) == sbh * 72 + as2b * 12
    assert est.per_layer("recompute") == 4 * sbh == shape.full_recompute_bytes(4)


def test_korthikanti_rows_show_zero_unexplained_bytes_on_cpu(small_gpt_target):
    setup, est = small_gpt_target
    from reportgen.checks.memory.estimate import korthikanti_rows

    rows = {r.variant: r for r in korthikanti_rows(setup, est, "target shape")}
    assert rows["plain"].extra["residual_bytes"] == 0 and rows["recompute"].extra["residual_bytes"] == 0
    assert rows["plain"].extra["mask_bytes"] == 4 and rows["plain"].extra["layernorms"] == 2


def test_paper_formula_is_34_and_5_in_16_bit():
    shape = TransformerShape(s=2048, b=1, h=12288, a=96, element_bytes=2)  # GPT-3 175B, paper Table 3
    sbh = 2048 * 12288
    assert shape.formula_bytes() == sbh * 34 + 96 * 2048 * 2048 * 5
    assert shape.formula_bytes() == sbh * (34 + 5 * 96 * 2048 // 12288)
    assert shape.full_recompute_bytes() == 2 * sbh


def test_estimate_at_a_large_shape_allocates_no_activations(gpt_cpu):
    """A 4096-wide, 2-layer stack at sequence 2048: over 4 GiB of activations (and 1.6 GB of weights)
    estimated, while the process grows by less than 512 MiB."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    _, est = _gpt_target(gpt_cpu, width=4096, depth=2, heads=32, s=2048, b=1)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert est.plain.total_bytes > 4 * 2**30
    assert grown < 2**29
    assert est.per_layer("recompute") == 4 * 2048 * 4096
    assert est.plain.per_module[REST] > 0


@pytest.mark.parametrize("bad", [{"modle": {}}, {"dtype": "float8"}])
def test_bad_estimate_config_is_refused(bad):
    with pytest.raises(EstimateConfigError):
        validate_overrides(bad)
