"""Sharded twins on 2 CPU ranks (gloo), started by torch's elastic launcher: DDP and FSDP2 parity,
a broken recompute setting that must FAIL, and a rank that raises (an ERROR row naming it).

Each test launches 2 ranks: ``distributed.start_method=auto`` (the product's default) spawns them in
the pipeline run, whose sharded rows the fsdp2 parity test reads too; the others fork them from the
tests' fork server (``conftest.FORKSERVER``)."""

from __future__ import annotations

import os
import time

import pytest
from conftest import FORKSERVER, run_pipeline, small_run
from rows import judged_row, raised_row

from reportgen.checks import required_names
from reportgen.checks.base.run import Run
from reportgen.checks.distributed.check import distributed_checks
from reportgen.commands.validation import config_problems
from reportgen.config import (
    DIST_GRADIENT_PARITY,
    DIST_MEMORY,
    DIST_STEP_PARITY,
    DIST_TASK_METRICS,
    DIST_TIME,
    DIST_TRAJECTORY,
)
from reportgen.results import Role, Status, judged_status, to_frame

#: 2 ranks; a test's collective gives up after 20 s.
SHARDED = ("distributed.world_size=2", "distributed.timeout_s=20")
#: The checks a sharded run adds.
SHARDED_CHECKS = [DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY, DIST_MEMORY, DIST_TIME, DIST_TASK_METRICS]
#: Runs whose subject is one parity check: one trajectory step, no sharded task-metrics training
#: (both covered by the parity test below).
ONE_STEP = ("parity.steps=1", "budget.enabled=false", "timing.warmup_steps=0", "timing.measured_steps=1")
#: A tiny mlp (2 residual blocks of width 16), a global batch of 8 (4 per rank), 2 timed steps.
TINY_MLP = (
    "+model=mlp",
    "model.depth=2",
    "model.width=16",
    "model.hidden=32",
    "parity.batch_size=8",
    "timing.warmup_steps=1",
    "timing.measured_steps=2",
    *SHARDED,
)


def sharded(*overrides: str, user_conf: bool = False):
    """The frame of the sharded checks alone, on 2 ranks (forked from the fork server unless
    ``overrides`` set ``distributed.start_method``)."""
    return to_frame(distributed_checks(small_run(FORKSERVER, *overrides, user_conf=user_conf)))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """``(exit code, results frame, output folder)`` of one ``run.run`` with 2 fsdp2 ranks started the
    product's default way (``spawn``: each rank a fresh interpreter building its setup from the pickled
    config); read by the pipeline test and by the fsdp2 parity test."""
    out = tmp_path_factory.mktemp("pipeline")
    code, frame = run_pipeline(out, *TINY_MLP, "distributed.strategy=fsdp2", "timing.max_overhead_ratio=1e6")
    return code, frame, out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_sharded_non_reentrant_recompute_gives_bitwise_equal_full_gradients(strategy, request):
    """ddp: ranks forked from the fork server; fsdp2: the sharded rows of the pipeline run (spawned ranks)."""
    if strategy == "ddp":
        frame = sharded(*TINY_MLP, "distributed.strategy=ddp")
    else:
        _, frame, _ = request.getfixturevalue("pipeline")
        frame = frame[frame.check.isin(SHARDED_CHECKS)]
    required = frame[frame.check.isin([DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY])]
    assert set(required.status) == {Status.PASS}, required[required.status != Status.PASS][["item", "detail"]]
    grads = frame[(frame.check == DIST_GRADIENT_PARITY) & (frame.role == Role.PARAM_GRAD)]
    assert len(grads) == 2 * 6 + 6 and grads.bitwise_equal.astype(bool).all()  # every parameter, full tensor
    params = frame[(frame.check == DIST_STEP_PARITY) & (frame.role == Role.PARAM)]
    assert len(params) == len(grads) and params.bitwise_equal.astype(bool).all()
    # per-rank rows carry their rank: both ranks' losses, generators, saved bytes and step times
    for check, role in (
        (DIST_GRADIENT_PARITY, Role.LOSS),
        (DIST_STEP_PARITY, Role.RNG),
        (DIST_MEMORY, "rank_saved_total"),
        (DIST_MEMORY, "rank_step_peak"),
        (DIST_TIME, "rank_step"),
    ):
        assert set(frame[(frame.check == check) & (frame.role == role)]["rank"].astype(int)) == {0, 1}, (check, role)
    steps = frame[(frame.check == DIST_TRAJECTORY) & (frame.variant == "recompute") & (frame.role == Role.TRAJECTORY)]
    synced = frame[frame.role == Role.RANK_SYNC]  # every twin's ranks in sync after every step of the 3 parity checks
    assert len(synced) == 3 * 3 and set(synced.status) == {Status.PASS} and synced.bitwise_equal.astype(bool).all()
    assert len(steps) == 2 * 3 and set(steps.step.astype(int)) == {1, 2, 3}  # parity.steps=3, on both ranks
    worst = frame[(frame.role == "max_rank_saved_total") & (frame.variant == "recompute")].iloc[0]
    assert worst.status == Status.PASS and worst.value < worst.threshold_value  # recompute keeps less on its worst rank
    peak = frame[(frame.role == "max_rank_step_peak") & (frame.variant == "recompute")].iloc[0]
    assert peak.comparator == "<=" and peak.value > 0 and peak.threshold_value > 0  # MemTracker on the sharded twins
    # task metrics of the sharded twins: the budget (32 examples, global batches of 8) is counted over both ranks
    budget = frame[frame.check == DIST_TASK_METRICS]
    accepted = budget[budget.role == Role.ACCEPTED]
    assert set(accepted.variant) == {"plain", "recompute"} and set(accepted.value) == {32.0}
    steps = budget[(budget.role == Role.RUN)].steps.astype(int)
    assert set(steps) == {4}  # 32 global examples in global batches of 8: 4 steps, not 8 (4 per rank)
    judged = budget[budget.role.isin([Role.METRIC_DIFF, Role.FINAL_PARAMS])]
    assert len(judged) == 2 and set(judged.status) == {Status.PASS}, judged[["item", "metric", "value", "detail"]]
    assert judged[judged.role == Role.FINAL_PARAMS].value.iloc[0] == 0.0  # non-reentrant: bitwise equal training


def test_sharded_dropout_without_preserved_rng_state_fails_naming_the_ranks():
    frame = sharded(
        "+model=dropout_rng",
        "recompute.preserve_rng_state=false",
        "parity.batch_size=8",
        *SHARDED,
        "distributed.strategy=fsdp2",
        "timing.warmup_steps=0",
        "timing.measured_steps=1",
        "parity.steps=1",
        "budget.examples=8",  # one global batch of 8: one training step already trains the twins apart
        user_conf=True,
    )
    grads = frame[(frame.check == DIST_GRADIENT_PARITY) & (frame.role == Role.PARAM_GRAD)]
    assert (grads.status == Status.FAIL).any()
    rng = frame[(frame.check == DIST_STEP_PARITY) & (frame.role == Role.RNG) & (frame.status == Status.FAIL)]
    assert set(rng["rank"].astype(int)) == {0, 1}  # each rank's generator advanced by the extra draws
    assert all(item.startswith(f"rank {int(r)}:") for item, r in zip(rng.item, rng["rank"]))
    trained = frame[(frame.check == DIST_TASK_METRICS) & (frame.role == Role.FINAL_PARAMS)]
    assert (
        list(trained.status) == [Status.FAIL] and "trained apart" in trained.detail.iloc[0]
    )  # the sharded twins drift


def test_a_rank_that_raises_gives_an_error_row_naming_it():
    frame = sharded(
        *FAULT,
        "model._target_=user_models.sharded.build_raises_on_rank",
        "recompute.targets=[RankFault]",
        "distributed.world_size=2",
        "distributed.timeout_s=1",  # rank 0 waits this long in the collective rank 1 never reaches
        user_conf=True,
    )
    errors = frame[frame.status.isin([Status.ERROR, Status.INCONCLUSIVE])]
    assert 1 in set(errors["rank"].astype(int))
    raised = errors[errors["rank"] == 1].iloc[0]
    assert (
        raised.check == DIST_GRADIENT_PARITY
        and "rank 1" in raised["item"]
        and "deliberate fault on rank 1" in raised.detail
    )
    # the block raises in every twin, the plain one first: the baseline is broken, so it cannot be judged
    assert raised.twin == "plain" and judged_status(frame[frame.check == DIST_GRADIENT_PARITY]) == Status.INCONCLUSIVE
    later = frame[frame.check.isin([DIST_STEP_PARITY, DIST_TRAJECTORY, DIST_MEMORY, DIST_TIME])]
    peaks = later.item.str.endswith(": run peak")  # each rank's own peak is stated even when it failed
    assert sorted(later[peaks].item) == ["rank 0: run peak", "rank 1: run peak"]
    assert set(later[~peaks].status) == {Status.NOT_RUN} and all("rank" in d for d in later[~peaks].detail)


def test_sharded_settings_are_refused_before_anything_runs(compose_cfg):
    problems = config_problems(compose_cfg("+model=ffn", "distributed.world_size=2", "distributed.backend=mpi"))
    assert "parity.batch_size=3 must be a multiple of distributed.world_size=2" in problems
    assert "distributed.backend='mpi' must be one of auto, gloo, nccl" in problems
    assert config_problems(compose_cfg("+model=ffn")) == ""
    # the sharded task metrics: budgets that do not split over the ranks, a seed listed twice
    problems = config_problems(
        compose_cfg(
            "+model=mlp", *SHARDED, "budget.batch_size=15", "budget.examples=255", "distributed.budget_seeds=[0,0]"
        )
    )
    assert "budget.batch_size=15 must be a multiple of distributed.world_size=2" in problems
    assert "budget.examples=255 must be a multiple of distributed.world_size=2" in problems
    assert "distributed.budget_seeds=[0, 0] repeats seed(s) 0" in problems
    assert config_problems(compose_cfg("+model=mlp", *SHARDED, "budget.batch_size=15", "budget.enabled=false")) == ""


def test_one_process_adds_no_sharded_rows(setup):
    assert distributed_checks(Run(setup("+model=ffn"))) == []


def test_the_pipeline_writes_one_report_with_every_ranks_rows(pipeline):
    """``run.run`` with 2 ranks: one frame (rank 0 gathered rank 1's rows), the sharded checks required,
    and page 1 naming world size, strategy, backend and the commands that reproduce the run."""
    code, frame, out = pipeline
    assert code == 0
    overhead = frame[frame.role == "max_rank_overhead"].iloc[0]  # slowest rank per step, paired bootstrap CI (a
    # deadline no step misses on a loaded machine: the subject is the comparator, not the figure)
    assert (
        overhead.comparator == "ci<="
        and overhead.status == Status.PASS
        and overhead.ci_low <= overhead.value <= overhead.ci_high
    )
    sharded_checks = [DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY, DIST_MEMORY, DIST_TIME]
    assert set(sharded_checks) <= set(frame.check) and set(frame["rank"].dropna().astype(int)) == {0, 1}
    html = (out / "report.html").read_text()
    assert "2 ranks · fsdp2 · backend gloo" in html and "torchrun --standalone --nproc-per-node=2" in html
    assert set(sharded_checks) <= set(required_names(None, distributed=True))
    assert not set(sharded_checks) & set(required_names(None))  # one process: not part of the claim


#: The user fault models (tests/user_models/sharded.py) on the dense 8-wide batch of tests/user_conf.
FAULT = ("+model=dropout_rng", "task.make_batch=user_models.faults.batch_small", "parity.batch_size=4")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_a_difference_on_one_rank_only_is_reported_with_its_rank(strategy):
    frame = sharded(
        *FAULT,
        "model._target_=user_models.sharded.build_rank_branch",
        "recompute.targets=[RankBranch]",
        *SHARDED,
        f"distributed.strategy={strategy}",
        *ONE_STEP,
        user_conf=True,
    )
    local = frame[frame.role == "rank_local_grads"].set_index("rank")
    assert (
        local.loc[0].status == Status.PASS and local.loc[1].status == Status.FAIL and "rank 1" in local.loc[1]["item"]
    )
    grads = frame[(frame.check == DIST_GRADIENT_PARITY) & (frame.role == Role.PARAM_GRAD)]
    assert (grads.status == Status.FAIL).any()  # the reduced full gradients differ too, without saying where


def test_a_rank_that_hangs_is_named_within_the_timeout():
    start = time.perf_counter()
    frame = sharded(
        *FAULT,
        "model._target_=user_models.sharded.build_sleeps_on_rank",
        "recompute.targets=[SleepsOnRank]",
        "distributed.world_size=2",
        "distributed.timeout_s=1",  # rank 0's collective gives up after 1 s; rank 1's watchdog stops it after 11.5 s
        user_conf=True,
    )
    assert time.perf_counter() - start < 40  # 1.5 x timeout_s + 10 s watchdog, plus start and stop (loaded machine)
    hung = frame[(frame.status == Status.ERROR) & (frame["rank"] == 1)]
    assert len(hung) == 1 and "rank 1" in hung.iloc[0].detail
    assert set(frame[frame.check != DIST_GRADIENT_PARITY].status) == {Status.NOT_RUN}


def test_reentrant_recompute_with_a_frozen_input_under_ddp_fails():
    """Reentrant recompute behind a frozen embedding: the blocks' gradients are None in the recompute
    twin (torch.utils.checkpoint docs, use_reentrant=True), also after DDP's all-reduce."""
    frame = sharded(
        "+model=frozen_input",
        "recompute=reentrant",
        *SHARDED,
        "distributed.strategy=ddp",
        *ONE_STEP,
        user_conf=True,
    )
    grads = frame[
        (frame.check == DIST_GRADIENT_PARITY) & (frame.role == Role.PARAM_GRAD) & (frame.status == Status.FAIL)
    ]
    assert grads.detail.str.contains("None in the recompute run").any()  # the adapters lost theirs
    local = frame[frame.role == "rank_local_grads"]
    assert set(local.status) == {Status.FAIL} and set(local["rank"].astype(int)) == {0, 1}


def test_slurm_tasks_become_ranks_and_a_mismatched_launch_is_refused(monkeypatch):
    from reportgen.distributed.launch import adopt_slurm_env, launch_problem, launch_rank, launched

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # recorded, so what adopt_slurm_env exports is undone after the test
        monkeypatch.delenv(name)
    assert launch_problem(2) == "" and not launched()
    for name, value in {
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "node7",
        "SLURM_JOB_ID": "123",
    }.items():
        monkeypatch.setenv(name, value)
    assert adopt_slurm_env() and launched() and launch_rank() == 1
    assert (os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("2", "1")
    assert launch_problem(2) == ""
    assert "set distributed.world_size=2" in launch_problem(1) and "set distributed.world_size=2" in launch_problem(4)


def test_the_slurm_launcher_config_runs_one_two_task_job_per_point():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose, initialize_config_dir

    from reportgen.config import register_configs
    from reportgen.paths import conf_dir

    register_configs()
    with initialize_config_dir(version_base="1.3", config_dir=str(conf_dir())):
        cfg = compose(
            "config",
            overrides=["+model=mlp", "hydra/launcher=slurm_distributed", "distributed.world_size=2"],
            return_hydra_config=True,
        )
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node * launcher.nodes == cfg.distributed.world_size


def test_ranks_on_cuda_need_a_gpu_each(monkeypatch):
    import torch

    from reportgen.distributed.launch import device_problem

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert "needs 2 GPUs on this node (one per rank) but torch sees 1" in device_problem(2, torch.device("cuda:0"))
    assert device_problem(2, torch.device("cpu")) == "" and device_problem(1, torch.device("cuda:0")) == ""


@pytest.mark.parametrize(
    "model, strategy", [("ffn", "ddp"), ("gpt", "fsdp2"), ("hf_gpt2", "fsdp2"), ("hf_llama", "ddp")]
)
def test_built_in_models_run_sharded_on_cpu(model, strategy):
    if model.startswith("hf_"):
        pytest.importorskip("transformers")
    small = ("model.depth=2", "model.width=32") if model == "gpt" else ()
    frame = sharded(
        f"+model={model}",
        *small,
        "parity.batch_size=4",
        *SHARDED,
        f"distributed.strategy={strategy}",
        *ONE_STEP,
    )
    parity = frame[frame.check.isin([DIST_GRADIENT_PARITY, DIST_STEP_PARITY])]
    assert len(parity) and set(parity.status) <= {
        Status.PASS,
        Status.INFO,
    }  # INFO: attributes the HF switch sets, ignored
    assert set(frame[frame.check == DIST_MEMORY].status) <= {Status.PASS, Status.INFO}


def test_the_diagnosis_names_a_one_rank_fault_and_a_failed_rank():
    from reportgen.report.diagnose import diagnose

    local = [
        judged_row(
            DIST_GRADIENT_PARITY,
            f"rank {r}: local gradients before reduction",
            "tensors_outside_tolerance",
            float(r),
            "==",
            0.0,
            role=Role.RANK_LOCAL_GRADS,
            extra={"rank": r},
        )
        for r in (0, 1)
    ]
    (said,) = diagnose(local, {"mode": "non_reentrant", "preserve_rng_state": True})
    assert said.extra["rule"] == "one rank only"
    failed = raised_row(DIST_GRADIENT_PARITY, "rank 1", "rank 1 failed: ValueError: boom", rank=1)
    (said,) = diagnose([failed], {"mode": "non_reentrant", "preserve_rng_state": True})
    assert said.extra["rule"] == "a rank failed"
