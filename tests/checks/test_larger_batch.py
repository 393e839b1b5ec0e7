"""The flagged larger-batch experiment (reportgen/checks/larger_batch.py)."""

import math

import pytest
import torch
from conftest import SMALL, compose_config
from rows import fact_row, judged_row

from reportgen.checks import larger_batch as lb
from reportgen.checks.base.run import Run
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.commands import run as pipeline
from reportgen.commands.run import prepare
from reportgen.config import GRADIENT_PARITY, LARGER_BATCH, TASK_METRICS
from reportgen.results import Role, Status, check_summary, claim_verdict, to_frame


def threshold_probe(limit, log=None):
    """A probe that fits up to ``limit`` examples; records the order of the batches asked for."""

    def probe(batch_size):
        if log is not None:
            log.append(batch_size)
        return lb.Probe(batch_size, float(batch_size), batch_size <= limit)

    return probe


def test_search_doubles_then_bisects_to_one_example():
    asked = []
    found, probes = lb.largest_fitting_batch(threshold_probe(300, asked), base=64, ceiling=4096)
    assert found == 300
    assert asked == [64, 128, 256, 512, 384, 320, 288, 304, 296, 300, 302, 301]
    assert [p.fits for p in probes] == [b <= 300 for b in asked]


def test_search_stops_at_the_ceiling():
    asked = []
    found, _ = lb.largest_fitting_batch(threshold_probe(10**9, asked), base=64, ceiling=1000)
    assert found == 1000 and asked == [64, 128, 256, 512, 1000]


def test_search_reports_none_when_the_base_batch_does_not_fit():
    found, probes = lb.largest_fitting_batch(threshold_probe(10), base=64, ceiling=4096)
    assert found is None and len(probes) == 1


def test_out_of_memory_is_a_measured_boundary():
    def measure(batch_size):
        if batch_size > 200:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return 10 * batch_size, batch_size

    found, probes = lb.largest_fitting_batch(lb.make_probe(measure, reference=10**6), base=64, ceiling=4096)
    assert found == 200
    oom = [p for p in probes if p.note == "out of memory"]
    assert oom and all(p.batch_size > 200 and not p.fits and math.isnan(p.bytes) for p in oom)


def test_a_task_that_cannot_fill_the_batch_is_the_ceiling():
    found, probes = lb.largest_fitting_batch(lb.make_probe(lambda b: (b, min(b, 150)), reference=10**6), 64, 4096)
    assert found == 150
    assert "task gives at most 150 examples per batch" in {p.note for p in probes if not p.fits}


def mlp_setup(*overrides, device="cpu"):
    return prepare(
        compose_config(
            "+model=mlp",
            "budget.examples=512",
            "budget.seeds=[0]",
            "budget.eval_every=256",
            f"device={device}",
            *overrides,
        )
    )


def test_mlp_finds_the_largest_fitting_batch_and_trains_it_to_the_budget():
    setup = mlp_setup()
    frame = to_frame(lb.larger_batch_experiment(Run(setup)))
    assert set(frame.status) == {Status.FLAGGED} and set(frame.variant) == {"larger_batch"}
    found = int(frame[frame["item"] == "batch found"].value.item())
    reference, _ = lb.saved_bytes(setup, False, 64)
    at_found, _ = lb.saved_bytes(setup, True, found)
    above, _ = lb.saved_bytes(setup, True, found + 1)
    assert found > 64 and at_found <= reference < above  # the boundary, measured independently
    run = frame[(frame.metric == "accuracy") & (frame.batch_size == found)].iloc[0]
    assert run.steps == math.ceil(512 / found) and run.accepted_examples == 512 and run.lr == 1e-3
    assert 0.0 < run.value <= 1.0
    base = frame[(frame.metric == "accuracy") & (frame.batch_size == 64)].iloc[0]
    assert base.steps == 8  # the plain run at the base batch, for comparison
    curve = frame[(frame.metric == "curve_accuracy") & (frame.batch_size == found)]
    assert curve.accepted_examples.iloc[0] == 0 and curve.accepted_examples.iloc[-1] == 512


def test_linear_lr_scaling_is_applied_and_stated():
    setup = mlp_setup("larger_batch.lr_scaling=linear", "larger_batch.max_batch_size=128")
    frame = to_frame(lb.larger_batch_experiment(Run(setup)))
    found = frame[frame["item"] == "batch found"].iloc[0]
    assert found.value == 128 and "scaled 2x (larger_batch.lr_scaling=linear)" in found.detail
    assert "ceiling larger_batch.max_batch_size=128" in found.detail
    run = frame[(frame.metric == "accuracy") & (frame.batch_size == 128)].iloc[0]
    assert run.lr == pytest.approx(2e-3)


def test_a_broken_experiment_is_still_only_flagged():
    setup = mlp_setup("larger_batch.lr_scaling=cubic")
    rows = lb.larger_batch_experiment(Run(setup))
    assert len(rows) == 1 and rows[0].status == Status.FLAGGED and "lr_scaling='cubic'" in rows[0].detail


def fake_larger(rows_status, value=1.0):
    found = {"variant": "larger_batch", "status": rows_status, "role": Role.BATCH_FOUND}
    return lambda setup: [fact_row(LARGER_BATCH, "batch found", "batch_size", value, **found)]


@pytest.mark.parametrize("required", [[TASK_METRICS], [TASK_METRICS, LARGER_BATCH]])
def test_larger_batch_result_never_changes_the_verdict(required):
    base = [judged_row(TASK_METRICS, "seed 0", "abs_diff_accuracy", 0.0, "<=", 1e-4)]
    assert base[0].status == Status.PASS
    verdicts = set()
    for extra in (
        [],
        fake_larger(Status.FLAGGED, 64)(None),
        fake_larger(Status.FLAGGED, 4096)(None),
        [
            fact_row(
                LARGER_BATCH, "experiment", "exception", variant="larger_batch", status=Status.FLAGGED, detail="boom"
            )
        ],
    ):
        verdicts.add(claim_verdict(to_frame(base + extra), [TASK_METRICS]))
    assert verdicts == {Status.PASS}
    summary = check_summary(to_frame(base + fake_larger(Status.FLAGGED)(None)), required)
    assert summary.set_index("check").status[LARGER_BATCH] == Status.FLAGGED


def test_exit_code_is_the_same_whatever_the_larger_batch_experiment_does(monkeypatch, tmp_path, use_checks):
    cfg = compose_config(
        "+model=ffn",
        *SMALL,
        "larger_batch.enabled=true",
        "larger_batch.max_batch_size=64",
        f"verdict.required=[{GRADIENT_PARITY}]",
    )
    codes = []
    broken = lambda setup: (_ for _ in ()).throw(RuntimeError("search failed"))
    for i, larger in enumerate(
        [fake_larger(Status.FLAGGED, 64), fake_larger(Status.FLAGGED, 4096), lb.larger_batch_experiment]
    ):
        use_checks((GRADIENT_PARITY, gradient_parity), (LARGER_BATCH, larger))
        out = tmp_path / str(i)
        out.mkdir()
        codes.append(pipeline.run(cfg, out))
    monkeypatch.setattr(lb, "_experiment", broken)
    use_checks((GRADIENT_PARITY, gradient_parity), (LARGER_BATCH, lb.larger_batch_experiment))
    (tmp_path / "broken").mkdir()
    codes.append(pipeline.run(cfg, tmp_path / "broken"))
    assert codes == [0, 0, 0, 0]


@pytest.mark.gpu
def test_cuda_search_uses_peak_allocated_bytes():
    setup = mlp_setup(device="cuda")
    frame = to_frame(lb.larger_batch_experiment(Run(setup)))
    assert set(frame.status) == {Status.FLAGGED}
    found = frame[frame.role == Role.BATCH_FOUND].iloc[0]
    reference = frame[frame.role == Role.REFERENCE].iloc[0]
    assert reference.metric == "cuda_peak_allocated_bytes" and reference.value > 0
    assert found.value >= 64
    peak, _ = lb.cuda_peak_bytes(setup, True, int(found.value))
    assert peak <= reference.value
