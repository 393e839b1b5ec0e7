"""Equal accepted-example budgets and task metrics (reportgen/training/loop.py, reportgen/checks/budget.py)."""

import math

import pandas as pd
import pytest
import torch
from conftest import compose_config
from user_models.nonfinite import SometimesInfTask, build, is_poisoned

from reportgen.checks.base.plots import task_metric_plots
from reportgen.checks.base.run import Run
from reportgen.checks.budget import task_metrics
from reportgen.commands.run import prepare
from reportgen.report.render import environment
from reportgen.results import check_summary, to_frame
from reportgen.training.loop import step_seed, train_to_budget
from reportgen.twins.step import training_step
from reportgen.twins.twin import Twin

ADAMW = {"_target_": "torch.optim.AdamW", "lr": 1e-3}


def budget_frame(*overrides, user_conf=False):
    """The task-metrics rows of a composed config as a frame."""
    setup = prepare(compose_config(*overrides, user_conf=user_conf))
    return to_frame(task_metrics(Run(setup))), setup


def status_of(frame):
    return check_summary(frame, []).set_index("check").status["task metrics"]


def pick(frame, **where):
    mask = pd.Series(True, index=frame.index)
    for key, value in where.items():
        mask &= frame[key] == value
    return frame[mask]


def test_mlp_twins_reach_identical_accuracy_per_seed_with_curves():
    frame, _ = budget_frame("+model=mlp", "budget.examples=256", "budget.seeds=[0,1]", "budget.eval_every=128")
    assert status_of(frame) == "PASS"
    for seed in (0, 1):
        plain = pick(frame, seed=seed, variant="plain", metric="accuracy").value.item()
        recompute = pick(frame, seed=seed, variant="recompute", metric="accuracy").value.item()
        assert plain == recompute and 0.1 < plain <= 1.0  # bitwise equal, and a real accuracy
        assert pick(frame, seed=seed, metric="abs_diff_accuracy").value.item() == 0.0
        for variant in ("plain", "recompute"):
            run = pick(frame, seed=seed, variant=variant, metric="accuracy").iloc[0]
            assert run.steps == 4 and run.accepted_examples == 256  # 256 examples / batch 64
            curve = pick(frame, seed=seed, variant=variant, metric="curve_accuracy")
            assert list(curve.accepted_examples) == [0, 128, 256]
            assert curve.value.iloc[-1] == plain  # the last curve point is the final evaluation
    # different seeds see different data: the runs are not all the same
    assert (
        pick(frame, seed=0, variant="plain", metric="loss").value.item()
        != pick(frame, seed=1, variant="plain", metric="loss").value.item()
    )
    mean = pick(frame, variant="plain", metric="mean_accuracy").iloc[0]
    values = pick(frame, variant="plain", metric="accuracy").value
    assert mean.value == pytest.approx(values.mean()) and mean["std"] == pytest.approx(values.std(ddof=1))


def test_ffn_without_rng_preservation_fails_and_says_how_the_metric_moved():
    frame, _ = budget_frame(
        "+model=ffn", "recompute.preserve_rng_state=false", "budget.examples=256", "budget.seeds=[0]"
    )
    assert status_of(frame) == "FAIL"
    diff = pick(frame, metric="abs_diff_loss").iloc[0]
    plain = pick(frame, variant="plain", metric="loss").value.item()
    recompute = pick(frame, variant="recompute", metric="loss").value.item()
    assert diff.value == abs(recompute - plain) > 1e-4
    assert diff.status == "FAIL" and "recompute is" in diff.detail and f"{plain:.6g}" in diff.detail


def test_ffn_with_rng_preservation_passes():
    frame, _ = budget_frame("+model=ffn", "budget.examples=128", "budget.seeds=[3]")
    assert status_of(frame) == "PASS"
    assert pick(frame, metric="abs_diff_loss").value.item() == 0.0


def expected_skips(task, seed, examples, batch_size):
    """Oracle: replay the batch generator and count poisoned batches until the budget is met."""
    generator = torch.Generator().manual_seed(seed)
    accepted = skipped = 0
    while accepted < examples:
        x, _ = task.make_batch(generator, min(batch_size, examples - accepted))
        if is_poisoned(x):
            skipped += 1
        else:
            accepted += len(x)
    return skipped


def test_non_finite_steps_are_skipped_and_not_accepted():
    frame, setup = budget_frame("+model=nonfinite_loss", user_conf=True)
    assert status_of(frame) == "PASS"
    for seed in (0, 1):
        want = expected_skips(setup.task, seed, 160, 16)
        assert want > 0
        for variant in ("plain", "recompute"):
            skipped = pick(frame, seed=seed, variant=variant, metric="skipped_steps").iloc[0]
            assert skipped.value == want
            assert f"{want} steps ({16 * want} examples) skipped" in skipped.detail
            assert pick(frame, seed=seed, variant=variant, metric="accepted_examples").value.item() == 160
            run = pick(frame, seed=seed, variant=variant, metric="loss").iloc[0]
            assert run.steps == 10 and math.isfinite(run.value)


def test_step_cap_turns_an_unreachable_budget_into_an_error():
    frame, _ = budget_frame("+model=nonfinite_loss", "task.inf_share=1.0", "budget.seeds=[0]", user_conf=True)
    assert status_of(frame) == "INCONCLUSIVE"  # the plain twin cannot reach the budget either: the baseline broke
    errors = frame[frame.status == "ERROR"]
    assert set(errors.variant) == {"plain", "recompute"}
    assert errors.detail.str.contains("budget not reached: only 0 of 160 examples accepted after the cap of 40").all()


def test_last_step_draws_only_what_the_budget_needs():
    torch.manual_seed(0)
    task = SometimesInfTask(inf_share=0.0)
    twin = Twin.of(build(), training_step(task), ADAMW)
    result = train_to_budget(
        twin,
        task,
        examples=100,
        batch_size=32,
        seed=0,
        forward_seed=0,
        device=torch.device("cpu"),
        dtype=torch.float32,
        eval_every=50,
    )
    assert (result.accepted_examples, result.steps, result.skipped_steps) == (100, 4, 0)  # 32 + 32 + 32 + 4
    assert [n for n, _ in result.curve] == [0, 64, 100]  # first crossing of 50 is at 64, of 100 at the end
    assert result.curve[-1][1] < result.curve[0][1]  # it learned something


def test_step_seeds_differ_per_step_and_seed_and_repeat():
    seeds = {step_seed(0, s, d) for s in range(3) for d in range(100)}
    assert len(seeds) == 300 and all(0 <= s < 2**63 for s in seeds)
    assert step_seed(71, 2, 5) == step_seed(71, 2, 5)


def test_disabled_budget_is_not_run(monkeypatch, tmp_path):
    """The runner, not the check, writes the row of a check whose group says enabled=false."""
    import reportgen.commands.run as pipeline
    from reportgen.checks import Check, budget

    setup = prepare(compose_config("+model=ffn", "budget.enabled=false"))
    called = []
    monkeypatch.setattr(
        pipeline, "REGISTRY", [Check(lambda s: called.append(s) or [], budget.CHECK.sections, config="budget")]
    )
    frame = to_frame(pipeline.run_checks(Run(setup), tmp_path))
    assert called == [] and status_of(frame) == "NOT_RUN"
    assert frame.detail.tolist() == ["not run: budget.enabled=false"]


def curve_frame(shift):
    rows = []
    for variant, delta in (("plain", 0.0), ("recompute", shift)):
        for n in (0, 100, 200):
            rows.append(
                {
                    "check": "task metrics",
                    "item": "seed 0",
                    "variant": variant,
                    "metric": "curve_loss",
                    "role": "curve",
                    "value": 1.0 / (1 + n) + delta * n,
                    "seed": 0,
                    "accepted_examples": n,
                    "batch_size": 10,
                }
            )
    return pd.DataFrame(rows)


def test_curve_plot_adds_a_drift_plot_only_when_the_twins_differ():
    assert len(task_metric_plots(curve_frame(0.0))) == 1
    plots = task_metric_plots(curve_frame(1e-3))
    assert len(plots) == 2 and plots[0].svg.startswith("<svg") and "drift" in plots[1].caption


def test_section_template_shows_each_seed_and_the_skipped_steps():
    frame, setup = budget_frame("+model=nonfinite_loss", "budget.seeds=[1]", user_conf=True)
    records = [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for r in frame.to_dict("records")
    ]
    html = (
        environment()
        .get_template("sections/task-metrics.html.j2")
        .render(section={"rows": records, "status": "PASS", "plots": []}, meta={}, medium="html")
    )
    want = expected_skips(setup.task, 1, 160, 16)
    assert f"{want} / {want}" in html  # skipped steps, plain / recompute
    assert "160 in every run" in html and "Per seed: held-out loss" in html
