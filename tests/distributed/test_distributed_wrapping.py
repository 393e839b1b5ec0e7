"""Public reports of recomputation under DDP / FSDP rebuilt as user models (issue 23), each reaching
its verdict through the product on 2 CPU ranks (gloo). Every scenario is one launch of the sharded
checks, shared by the tests that read it (module-scoped cache); settings are tiny. The plain twin
broken by itself is the pipeline run's scenario (its sharded rows), not a launch of its own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import FORKSERVER, SMALL, TESTS, USER_CONF, cli_env, run_pipeline, small_run

from reportgen.checks.distributed.check import distributed_checks
from reportgen.config import DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY
from reportgen.report.diagnose import diagnose
from reportgen.results import Role, Status, claim_verdict, to_frame

pytestmark = pytest.mark.slow

#: 2 ranks, a global batch of 4, one timed step, no sharded budget training (covered by test_distributed).
BASE = (
    "parity.batch_size=4",
    "timing.warmup_steps=0",
    "timing.measured_steps=1",
    "distributed.world_size=2",
    "distributed.timeout_s=20",
    "budget.enabled=false",
    FORKSERVER,  # ranks fork from a server with torch imported (tests/conftest.py)
)
MLP = ("+model=mlp", "model.depth=2", "model.width=16", "model.hidden=32")
PARITY = (DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY)
SCENARIOS = {
    "ddp reentrant unused": (MLP + ("recompute=reentrant", "distributed.ddp.find_unused_parameters=true"), False),
    "ddp non-reentrant unused": (MLP + ("distributed.ddp.find_unused_parameters=true",), False),
    "twice reentrant": (("+model=twice_block", "recompute=reentrant"), True),
    "twice static graph": (("+model=twice_block", "recompute=reentrant", "distributed.ddp.static_graph=true"), True),
    "twice custom wrap": (
        (
            "+model=twice_block",
            "recompute=reentrant",
            "distributed.strategy=custom",
            "distributed.wrap=user_models.dist_wrapping.wrap_ddp_static",
        ),
        True,
    ),
    "frozen input": (("+model=frozen_input", "recompute=reentrant"), True),
    "killed rank": (("+model=killed_rank",), True),
    "fsdp2 no reshard": (MLP + ("distributed.strategy=fsdp2", "distributed.fsdp.reshard_after_forward=false"), False),
    "fsdp1 linear units": (MLP + ("distributed.strategy=fsdp1", "distributed.fsdp.units=[Linear]"), False),
}
#: The user's training step (tests/user_models/dist_step.py): 8 examples, 4 per rank, 4 micro-batches of 1.
STEP = tuple(o for o in BASE if not o.startswith("parity.batch_size")) + ("parity.batch_size=8",)
STEP_SCENARIOS = {
    "two forwards reentrant": ("+model=two_forwards", "recompute=reentrant"),
    "two forwards non-reentrant": ("+model=two_forwards",),
    "accumulate ddp": ("+model=accumulate_step",),
    "accumulate fsdp2": ("+model=accumulate_step", "distributed.strategy=fsdp2"),
    "accumulate rng not preserved": ("+model=accumulate_step", "recompute.preserve_rng_state=false"),
}
SETTINGS = {"preserve_rng_state": True, "strategy": "ddp"}


@pytest.fixture(scope="module")
def launched():
    """``launched(name) -> (rows, frame)``: the sharded checks of one scenario, run once per module."""
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            overrides, user = SCENARIOS[name] if name in SCENARIOS else ((*STEP, *STEP_SCENARIOS[name]), True)
            rows = distributed_checks(small_run(*(BASE if name in SCENARIOS else ()), *overrides, user_conf=user))
            cache[name] = rows, to_frame(rows)
        return cache[name]

    return get


def verdict(frame) -> str:
    return claim_verdict(frame, PARITY)


def test_ddp_reentrant_with_find_unused_parameters_errors_naming_the_cause(launched):
    rows, frame = launched("ddp reentrant unused")
    raised = frame[frame.status == Status.ERROR]
    assert set(raised["rank"].astype(int)) == {0, 1} and set(raised.twin) == {"recompute"}
    assert raised.detail.str.contains("Expected to mark a variable ready only once").all()
    said = [r for r in diagnose(rows, {**SETTINGS, "mode": "reentrant"}) if r.check == DIST_GRADIENT_PARITY][0]
    assert said.extra["rule"] == "DDP: parameter ready twice" and "static_graph=true" in said.extra["fix"]
    assert '"Expected to mark a variable ready only once"' in said.extra["cause"]
    assert verdict(frame) == Status.FAIL
    _, healthy = launched("ddp non-reentrant unused")
    assert verdict(healthy) == Status.PASS


def test_a_block_applied_twice_errors_under_ddp_reentrant_and_passes_with_a_static_graph(launched):
    _, twice = launched("twice reentrant")
    assert verdict(twice) == Status.FAIL and (twice[twice.status == Status.ERROR].twin == "recompute").all()
    _, static = launched("twice static graph")
    assert verdict(static) == Status.PASS
    synced = static[static.role == Role.RANK_SYNC]
    assert len(synced) == 9 and set(synced.status) == {Status.PASS}  # 3 twins x 3 parity checks
    _, custom = launched("twice custom wrap")  # the same DDP, written by the user in distributed.wrap
    assert verdict(custom) == Status.PASS


def test_reentrant_with_a_frozen_input_fails_and_the_ranks_drift(launched):
    rows, frame = launched("frozen input")
    assert verdict(frame) == Status.FAIL
    drift = frame[(frame.role == Role.RANK_SYNC) & (frame.check == DIST_GRADIENT_PARITY)].set_index("twin")
    assert drift.loc["plain"].status == Status.PASS and drift.loc["recompute"].status == Status.FAIL
    assert "head." in drift.loc["recompute"].detail and "rank 1" in drift.loc["recompute"].detail


@pytest.fixture(scope="module")
def unused_parameter(tmp_path_factory):
    """``(exit code, results frame, output folder)`` of the whole pipeline on a model with a parameter its
    forward never uses (the plain twin breaks DDP by itself), with a DDP bucket size page 1 must show."""
    out = tmp_path_factory.mktemp("unused")
    code, frame = run_pipeline(
        out,
        "+model=unused_param",
        *BASE,
        "distributed.ddp.bucket_cap_mb=1",
        "run.max_estimated_minutes=null",
        user_conf=True,
    )
    return code, frame, out


def test_a_plain_twin_broken_by_itself_cannot_be_judged(unused_parameter):
    _, frame, _ = unused_parameter
    frame = frame[frame.check.str.startswith("distributed")]  # the sharded checks' rows alone
    assert verdict(frame) == Status.INCONCLUSIVE  # exit 3, never "recompute fails"
    baseline = frame[frame.status == Status.INCONCLUSIVE]
    assert set(baseline.twin.dropna()) <= {"plain", "aa"} and len(baseline)


def test_the_pipeline_exits_3_for_a_plain_twin_broken_by_itself_and_page_one_shows_the_wrapping(unused_parameter):
    code, frame, out = unused_parameter
    assert code == 3  # INCONCLUSIVE: the baseline breaks DDP by itself
    assert frame[frame.role == Role.RANK_SYNC].twin.isin(["plain", "aa"]).any()
    html = (out / "report.html").read_text()
    assert "ddp.find_unused_parameters=False" in html and "ddp.bucket_cap_mb=1.0" in html
    assert "order: build from the shared initial weights" in html and "training step: reportgen" in html


def test_a_rank_the_os_killed_is_named_and_cannot_be_judged(launched):
    _, frame = launched("killed rank")
    killed = frame[frame.status == Status.INCONCLUSIVE].iloc[0]
    assert killed["rank"] == 1 and killed.signal == "SIGKILL" and "killed by SIGKILL" in killed.detail
    assert verdict(frame) == Status.INCONCLUSIVE


@pytest.mark.parametrize("name", ["fsdp2 no reshard", "fsdp1 linear units"])
def test_fsdp_settings_users_train_with_pass(launched, name):
    _, frame = launched(name)
    parity = frame[frame.check.isin(PARITY)]
    assert verdict(frame) == Status.PASS, parity[parity.status != Status.PASS][["item", "detail"]]
    grads = parity[(parity.role == Role.PARAM_GRAD)]
    assert len(grads) == 3 * 6 and grads.bitwise_equal.astype(bool).all()  # full tensors, every parameter
    assert not (frame.status == Status.ERROR).any(), frame[frame.status == Status.ERROR][
        ["check", "detail"]
    ]  # memory, time too


def test_two_forwards_before_one_backward_in_the_users_step_errors_under_reentrant_only(launched):
    _, reentrant = launched("two forwards reentrant")
    assert verdict(reentrant) == Status.FAIL and (reentrant[reentrant.status == Status.ERROR].twin == "recompute").all()
    _, non_reentrant = launched("two forwards non-reentrant")
    assert verdict(non_reentrant) == Status.PASS


@pytest.mark.parametrize("name", ["accumulate ddp", "accumulate fsdp2"])
def test_accumulation_clipping_adamw_and_a_cosine_schedule_pass(launched, name):
    _, frame = launched(name)
    parity = frame[frame.check.isin(PARITY)]
    assert verdict(frame) == Status.PASS, parity[parity.status != Status.PASS][["item", "detail"]]
    state = parity[(parity.role == Role.OPTIMIZER_STATE)]
    assert state["item"].str.contains("exp_avg_sq").any()  # AdamW's, the user's optimizer
    steps = parity[(parity.check == DIST_TRAJECTORY) & (parity.role == Role.TRAJECTORY)]
    assert set(steps.status) == {Status.PASS} and len(steps) == 2 * 2 * 3  # 3 steps, recompute and A/A rows, 2 ranks


def test_the_users_step_fails_when_its_regions_rng_is_not_preserved(launched):
    _, frame = launched("accumulate rng not preserved")
    assert verdict(frame) == Status.FAIL
    grads = frame[(frame.check == DIST_GRADIENT_PARITY) & (frame.role == Role.PARAM_GRAD)]
    assert (grads.status == Status.FAIL).any()


def test_sigterm_in_the_middle_of_a_distributed_check_exits_143_with_partial_rows_and_no_signature(tmp_path):
    """A preemption while rank 1 hangs inside the sharded checks: exit 143, the single-process rows kept
    in results.partial.json, the sharded checks NOT_RUN, no report, nothing signed."""
    out, started = tmp_path / "out", tmp_path / "rank-1-sleeps"
    args = [
        "--config-dir",
        str(USER_CONF),
        "+model=dropout_rng",
        "model._target_=user_models.sharded.build_sleeps_on_rank",
        f"+model.started={started}",  # rank 1 creates it as it starts sleeping in its forward
        "recompute.targets=[SleepsOnRank]",
        "task.make_batch=user_models.faults.batch_small",
        "parity.batch_size=4",
        "distributed.world_size=2",
        "distributed.timeout_s=300",
        *SMALL,
        "report.sign=false",
        "run.max_estimated_minutes=null",
        f"hydra.run.dir={out}",
    ]
    env = cli_env(str(TESTS))  # user_models importable
    proc = subprocess.Popen(
        [sys.executable, "-m", "reportgen", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and proc.poll() is None and not started.exists():
        time.sleep(0.1)  # inside a check once it exists: rank 1 sleeps in its forward, rank 0 waits for it
    assert proc.poll() is None and started.exists(), proc.stdout.read()
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output
    partial = json.loads((out / "results.partial.json").read_text())
    sharded = [r for r in partial if r["check"].startswith("distributed")]
    assert sharded and all(r["status"] == "NOT_RUN" for r in sharded)
    assert any(r["status"] == Status.PASS for r in partial)  # the single-process rows measured before it
    assert not (out / "results.json").exists() and not (out / "report.html").exists()
    assert not [p for p in out.rglob("*") if "sig" in p.name or "statement" in p.name]
