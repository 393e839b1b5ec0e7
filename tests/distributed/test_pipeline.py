"""Pipeline stages (issue 42, item 4): ``distributed.mesh={pp:2}`` on 2 CPU ranks (gloo), a 2-block MLP cut at
``blocks.1``, GPipe and 1F1B. A healthy model passes comparing both stages' parameters by name; dropout recomputed
without its RNG state in a stage-1 region fails naming a stage-1 parameter. The PP example of
docs/distributed_wrapping.md is the healthy 1F1B run (its overrides read from the guide)."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import FORKSERVER, REPO, run_pipeline

from reportgen.commands.validation import config_problems
from reportgen.config import DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY
from reportgen.models.mlp import DigitsMLP
from reportgen.results import Role, Status

pytestmark = pytest.mark.slow

#: The one-line fault: only blocks.1 (stage 1) recomputes, and its dropout draws a new mask when it does.
FAULT = ("recompute.targets=[blocks.1]", "recompute.preserve_rng_state=false")
#: What the end-to-end runs leave out (their subject is the sharded checks): the budget runs, the controls.
QUICK = ("budget.enabled=false", "controls.enabled=false", "run.max_estimated_minutes=null", "distributed.timeout_s=60")


def doc_overrides() -> list[str]:
    """The overrides of docs/distributed_wrapping.md's pipeline example, as the shell passes them."""
    text = (REPO / "docs" / "distributed_wrapping.md").read_text()
    section = text.split("## Pipeline stages", 1)[1]
    block = re.search(r"(?ms)^```bash\n(.*?)^```", section).group(1)
    words = shlex.split(block.replace("\\\n", " "))
    return words[words.index("reportgen") + 1 :]


def with_schedule(overrides: list[str], schedule: str) -> list[str]:
    return [o for o in overrides if not o.startswith("distributed.pipeline.schedule=")] + [
        f"distributed.pipeline.schedule={schedule}"
    ]


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """``ran(schedule, faulty) -> (exit code, frame)``: the whole pipeline of the guide's example, run once each."""
    cache: dict = {}

    def get(schedule: str, faulty: bool):
        if (schedule, faulty) not in cache:
            out = tmp_path_factory.mktemp(f"pp-{schedule}-{'fault' if faulty else 'healthy'}")
            overrides = with_schedule(doc_overrides(), schedule) + [*QUICK, FORKSERVER, *(FAULT if faulty else ())]
            cache[schedule, faulty] = run_pipeline(out, *overrides)
        return cache[schedule, faulty]

    return get


def stage_names(depth: int = 2) -> dict[int, set[str]]:
    """``{stage: parameter names}`` of the guide's model cut at blocks.1 (the model itself says which exist)."""
    names = [n for n, _ in DigitsMLP(width=16, depth=depth, hidden=32).named_parameters()]
    first = {n for n in names if n.startswith(("embed.", "blocks.0."))}
    return {0: first, 1: set(names) - first}


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_a_healthy_model_exits_0_comparing_both_stages_parameters_by_name(ran, schedule):
    code, frame = ran(schedule, False)
    sharded = frame[frame.check.isin([DIST_GRADIENT_PARITY, DIST_STEP_PARITY, DIST_TRAJECTORY])]
    bad = sharded[~sharded.status.isin([Status.PASS, Status.INFO, Status.WARN])]
    assert code == 0, bad[["check", "item", "status", "detail"]]
    for role, suffix in ((Role.PARAM_GRAD, ".grad"), (Role.PARAM, "")):
        rows = sharded[(sharded.role == role) & (sharded.check != DIST_TRAJECTORY)]
        for stage, names in stage_names().items():
            mine = rows[rows.stage == stage]
            assert set(mine["rank"].astype(int)) == {stage}  # each stage's tensors from the rank that holds it
            compared = {re.sub(r"^rank \d: (param )?| \(stage \d\)$", "", i).removesuffix(suffix) for i in mine["item"]}
            assert compared == names
            assert mine.bitwise_equal.astype(bool).all()
    state = sharded[(sharded.role == Role.OPTIMIZER_STATE)]
    assert set(state.stage.astype(int)) == {0, 1} and (state.status == Status.PASS).all()
    loss = sharded[sharded.role == Role.LOSS]
    assert list(loss["rank"].astype(int)) == [1] and float(loss.value.iloc[0]) == 0.0  # the last stage's loss
    synced = sharded[sharded.role == Role.RANK_SYNC]
    assert list(synced.status) == [Status.INFO]  # nothing replicated: never a cross-stage comparison
    assert (frame[frame.check == "distributed memory per rank"].status == Status.NOT_RUN).any()  # not built: said


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_dropout_recomputed_without_its_rng_state_in_stage_1_exits_1_naming_a_stage_1_parameter(ran, schedule):
    code, frame = ran(schedule, True)
    assert code == 1
    grads = frame[(frame.check == DIST_GRADIENT_PARITY) & (frame.role == Role.PARAM_GRAD)]
    failed = grads[grads.status == Status.FAIL]
    stage_1 = failed[failed.stage == 1]
    assert len(stage_1) and stage_1["item"].str.startswith("rank 1: blocks.1.").any()
    assert set(stage_1["rank"].astype(int)) == {1}
    assert {i.split(" ")[2].removesuffix(".grad") for i in stage_1["item"]} <= stage_names()[1]


@pytest.mark.parametrize(
    "override, said",
    [
        ("distributed.pipeline.schedule=Interleaved1F1B", "several stages per rank are not built yet"),
        ("distributed.pipeline.split=[blocks.1,head]", "gives 3 stage(s) but distributed.mesh has pp=2"),
        ("distributed.pipeline.microbatches=3", "must be ≥ 1 and divide parity.batch_size=8"),
        ("verdict.required=null", "are not built for pipeline stages"),
        ("distributed.strategy=fsdp2", "with pipeline stages: every stage lives on one rank"),
    ],
)
def test_what_is_not_built_is_refused_before_anything_runs(compose_cfg, override, said):
    assert config_problems(compose_cfg(*doc_overrides())) == ""
    assert said in config_problems(compose_cfg(*doc_overrides(), override))


def test_page_one_states_the_pipeline_and_no_data_parallel_wrapping(compose_cfg):
    """A PP run's page 1 names its split, schedule and micro-batches; DDP's settings were never applied to it."""
    from reportgen.distributed.wrapping import settings_in_force, wrap_order

    dc = compose_cfg(*with_schedule(doc_overrides(), "1F1B")).distributed
    said = settings_in_force(dc, ["blocks.0", "blocks.1"])
    assert said == {
        "mesh": "pp=2",
        "pipeline.split": "blocks.1",
        "pipeline.schedule": "1F1B",
        "pipeline.microbatches": 4,
    }
    order = wrap_order(dc)
    assert "into 2 stages" in order and "Schedule1F1B over 4 micro-batches" in order
    assert "DistributedDataParallel" not in order
