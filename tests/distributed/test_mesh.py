"""Named N-D meshes (issue 42, items 3, 5 and 7): ``distributed.mesh`` as torchtitan names its dimensions, the
batch split over the data-parallel ones only, the user's ``wrap(model, mesh)`` on a ``{dp_shard:2,tp:2}`` mesh
(tensor parallel, then FSDP2; with sequence parallel too) on 4 CPU ranks (gloo), diagnoses by the layout in
force, and a fault the single-process checks prove failing the claim beside a sharded baseline that cannot be
judged. The 2-D example of docs/distributed_wrapping.md is written out from the guide and run as written."""

from __future__ import annotations

import json
import time

import pytest
import torch
from conftest import FORKSERVER, SMALL, TESTS, reportgen, run_dirs, small_run
from rows import allclose_row, judged_row
from test_readme import blocks, doc_file

from reportgen.checks.distributed.check import distributed_checks
from reportgen.commands.validation import config_problems
from reportgen.config import DIST_GRADIENT_PARITY, DIST_STEP_PARITY, GRADIENT_PARITY
from reportgen.distributed.mesh import Layout, layout_of
from reportgen.report.diagnose import diagnose
from reportgen.report.metadata import recompute_settings
from reportgen.results import Role, Status, claim_verdict, to_frame

#: 4 ranks on a ``dp_shard × tp`` mesh, the user's own ``wrap``.
MESH = ("distributed.world_size=4", "distributed.mesh={dp_shard:2,tp:2}", "distributed.strategy=custom")
#: A whole report cut to seconds (tests/distributed/test_distributed_strategies.py's settings): a global batch of 4
#: (2 per data-parallel rank), one trajectory step, one timed step, 32 budget examples in global batches of 8.
TINY = (
    "distributed.timeout_s=60",
    FORKSERVER,
    *(o for o in SMALL if not o.startswith("report.")),
    "parity.batch_size=4",
    "parity.steps=1",
    "timing.warmup_steps=0",
    "timing.measured_steps=1",
    "timing.max_overhead_ratio=1e6",  # a loaded 2-core machine: the subject is the verdict, not the overhead
    "run.max_estimated_minutes=null",
    "report.sign=false",
    "report.pdf=false",
)
#: The built-in mlp at its smallest: 2 residual blocks (dropout 0.1) of width 16, hidden 32 (split over 2 TP ranks).
MLP = ("+model=mlp", "model.depth=2", "model.width=16", "model.hidden=32")
DOC = "docs/distributed_wrapping.md"


def test_the_layout_numbers_ranks_as_init_device_mesh_and_splits_the_batch_over_data_parallel_ranks(compose_cfg):
    """Written ``{tp:2,dp_shard:2,dp_replicate:2}``, laid out ``dp_replicate × dp_shard × tp`` (torchtitan's order);
    each rank's coordinates are where ``torch.arange(8).view(2, 2, 2)`` (``init_device_mesh``'s numbering) holds
    it, and tensor-parallel peers take the same share of the batch."""
    dc = compose_cfg(
        "+model=mlp", "distributed.world_size=8", "distributed.mesh={tp:2,dp_shard:2,dp_replicate:2}"
    ).distributed
    layout = layout_of(dc)
    assert layout.names == ("dp_replicate", "dp_shard", "tp") and layout.shape == (2, 2, 2) and layout.dp_size == 4
    grid = torch.arange(8).view(layout.shape)
    for rank in range(8):
        at = layout.coordinates(rank)
        assert int(grid[tuple(at[n] for n in layout.names)]) == rank
        assert layout.dp_rank(rank) == at["dp_replicate"] * 2 + at["dp_shard"]
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # ranks 2k, 2k+1 are TP peers
    flat = Layout(world_size=4)  # distributed.mesh unset: every rank its own share, as before
    assert flat.shape == (4,) and [flat.dp_rank(r) for r in range(4)] == [0, 1, 2, 3] and flat.said() == "1-D, 4 ranks"


def test_a_mesh_that_does_not_fit_is_refused_naming_the_fix(compose_cfg):
    problems = lambda *o: config_problems(compose_cfg("+model=mlp", *o))
    wrong = problems("distributed.world_size=8", "distributed.mesh={dp_shard:2,tp:2}", "distributed.strategy=custom")
    assert "lays out 4 ranks (2 × 2) but distributed.world_size=8; set distributed.world_size=4" in wrong
    fsdp_tp = problems("distributed.world_size=4", "distributed.mesh={dp_shard:2,tp:2}", "distributed.strategy=fsdp2")
    assert "tensor parallel is applied by your own function; set distributed.strategy=custom" in fsdp_tp
    ddp = problems("distributed.world_size=4", "distributed.mesh={dp_replicate:2,dp_shard:2}")
    assert "would be ignored with distributed.strategy=ddp" in ddp
    one = problems("distributed.mesh={dp_shard:1}", "distributed.strategy=fsdp2")
    assert "would be ignored with distributed.world_size=1" in one
    with pytest.raises(Exception, match="sp"):  # not a dimension name: the schema refuses it at compose time
        compose_cfg("+model=mlp", "distributed.world_size=4", "distributed.mesh={sp:4}")
    # the batch is split over the 2 data-parallel ranks only: 6 examples fit {dp_shard:2,tp:2}, not 4 flat ranks
    assert "parity.batch_size" not in problems(*MESH, "distributed.wrap=m.f", "parity.batch_size=6")
    assert "parity.batch_size=6 must be a multiple of distributed.world_size=4" in problems(
        "distributed.world_size=4", "parity.batch_size=6"
    )
    hsdp = problems(
        "distributed.world_size=4", "distributed.mesh={dp_replicate:2,dp_shard:2}", "distributed.strategy=fsdp2"
    )
    assert hsdp == ""


def _drift_rows(plain_only: bool = True):
    """A rank-sync row of the plain twin out of sync (INCONCLUSIVE), as the sharded checks write it."""
    return [
        judged_row(
            DIST_STEP_PARITY,
            "rank sync (plain)",
            "tensors_out_of_sync",
            1.0,
            "==",
            0.0,
            role=Role.RANK_SYNC,
            on_miss=Status.INCONCLUSIVE,
            variant="plain",
            extra={"twin": "plain"},
        )
    ]


@pytest.mark.parametrize(
    ("mesh", "rule"),
    [
        ({"dp_shard": 2, "tp": 2}, "FSDP: parameters outside every unit"),
        ({}, "FSDP: parameters outside every unit"),  # the 1-D mesh: your wrap may fully_shard on it
        ({"dp_replicate": 2, "tp": 2}, "ranks drift without FSDP"),
    ],
)
def test_a_drift_is_diagnosed_by_the_layout_in_force(mesh, rule):
    settings = {"mode": "non_reentrant", "strategy": "custom", "distributed": {"wrap": "m.f"}, "mesh": mesh}
    (said,) = diagnose(_drift_rows(), settings)
    assert said.extra["rule"] == rule
    if not mesh.get("dp_shard") and mesh:
        assert (
            "FSDP" not in said.extra["cause"].replace("no FSDP", "") and "dp_replicate=2 × tp=2" in said.extra["cause"]
        )


def test_a_fault_the_single_process_checks_prove_fails_beside_a_sharded_baseline_that_cannot_be_judged():
    drift = _drift_rows()
    fault = allclose_row(GRADIENT_PARITY, "w.grad", 0.5, 0.49)
    healthy = allclose_row(GRADIENT_PARITY, "w.grad", 0.0, -1e-5)
    required = [GRADIENT_PARITY, DIST_STEP_PARITY]
    assert claim_verdict(to_frame([fault, *drift]), required) == Status.FAIL
    assert claim_verdict(to_frame([healthy, *drift]), required) == Status.INCONCLUSIVE
    # a sharded failure next to its own broken baseline is not counted: the baseline cannot be trusted
    sharded_fail = allclose_row(DIST_GRADIENT_PARITY, "w.grad (full)", 0.5, 0.49)
    assert claim_verdict(to_frame([healthy, sharded_fail, *drift]), [*required, DIST_GRADIENT_PARITY]) == (
        Status.INCONCLUSIVE
    )
    # a single-process baseline that cannot be judged still outranks everything
    aa = judged_row(GRADIENT_PARITY, "A/A", "max_abs_err", 1.0, "==", 0.0, role=Role.AA, on_miss=Status.INCONCLUSIVE)
    assert claim_verdict(to_frame([fault, aa]), required) == Status.INCONCLUSIVE


def _doc_example(tmp_path):
    """The guide's ``my_pkg/parallel.py`` written out under ``tmp_path``, and its command's overrides."""
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "parallel.py").write_text(doc_file(DOC, "my_pkg/parallel.py"))
    (command,) = [b.text for b in blocks(TESTS.parent / DOC) if "my_pkg.parallel.wrap" in b.text and b.lang == "bash"]
    words = command.replace("\\\n", " ").split()
    return [w.strip("'") for w in words[words.index("reportgen") + 1 :]]


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "code"), [((), 0), (("recompute.preserve_rng_state=false",), 1)])
def test_the_guides_fsdp2_by_tensor_parallel_example_runs_as_written(fault, code, tmp_path):
    """docs/distributed_wrapping.md, "Two dimensions": the mlp (dropout 0.1) exits 0; with its regions' RNG not
    preserved it exits 1 and the diagnosis names the RNG setting."""
    args = _doc_example(tmp_path)
    assert args[:1] == ["+model=mlp"] and "distributed.mesh={dp_shard:2,tp:2}" in args
    started = time.perf_counter()
    proc = reportgen(tmp_path, *args, *MLP[1:], *TINY, *fault, pythonpath=str(tmp_path))
    print(f"2-D mlp {fault}: exit {proc.returncode} in {time.perf_counter() - started:.1f} s")
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    [out] = run_dirs(tmp_path)
    rows = json.loads((out / "results.json").read_text())
    assert not [r for r in rows if r["status"] == "ERROR"]
    # each rank's loss row: its excess is -(atol + rtol·|plain loss|), so it tells the rank's loss apart
    losses = {r["rank"]: r["excess"] for r in rows if r.get("role") == Role.LOSS and r["check"] == DIST_GRADIENT_PARITY}
    # ranks 0, 1 (and 2, 3) are TP peers: the same 2 examples, the same loss; the two data-parallel ranks differ
    assert losses[0] == losses[1] and losses[2] == losses[3] and losses[0] != losses[2]
    html = (out / "report.html").read_text()
    assert "dp_shard=2 × tp=2, 4 ranks; each batch split over its 2 data-parallel ranks" in html
    reference = [r for r in rows if r.get("role") == Role.SHARDING_REFERENCE]
    assert reference and all("plain model unsharded, in one process (rank 0 alone)" in r["detail"] for r in reference)
    if code:
        assert "preserve_rng_state=true" in proc.stdout + proc.stderr


SP = ("+model=sequence_parallel", *MESH, "distributed.wrap=user_models.tensor_parallel.wrap_sequence_parallel")


@pytest.mark.slow
@pytest.mark.parametrize(("fault", "code"), [((), 0), (("recompute.preserve_rng_state=false",), 1)])
def test_tensor_and_sequence_parallel_inside_fsdp2(fault, code, tmp_path):
    """tests/user_models/tensor_parallel.py: norms sequence parallel, the MLP column/row parallel with its output
    reduce-scattered back to sequence shards, FSDP2 over dp_shard; dropout in every block."""
    started = time.perf_counter()
    proc = reportgen(tmp_path, "--config-dir", str(TESTS / "user_conf"), *SP, *TINY, *fault, pythonpath=str(TESTS))
    print(f"2-D sequence parallel {fault}: exit {proc.returncode} in {time.perf_counter() - started:.1f} s")
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    [out] = run_dirs(tmp_path)
    rows = json.loads((out / "results.json").read_text())
    assert not [r for r in rows if r["status"] == "ERROR"]
    grads = [r for r in rows if r.get("role") == Role.PARAM_GRAD and r["check"] == DIST_GRADIENT_PARITY]
    assert {r["status"] for r in grads} == ({"PASS"} if code == 0 else {"PASS", "FAIL"})
    if code:
        assert "preserve_rng_state=true" in proc.stdout + proc.stderr


def test_ranks_without_fsdp_that_drift_are_diagnosed_by_their_mesh():
    """``{dp_replicate:2,tp:2}`` and a ``wrap`` that applies tensor parallel but never reduces gradients over
    ``dp_replicate``: the plain twin's replicas drift (INCONCLUSIVE), and the cause names the mesh, not FSDP."""
    run = small_run(
        FORKSERVER,
        *MLP,
        "distributed.world_size=4",
        "distributed.mesh={dp_replicate:2,tp:2}",
        "distributed.strategy=custom",
        "distributed.wrap=user_models.tensor_parallel.wrap_tensor_parallel_only",
        "distributed.timeout_s=60",
        "parity.batch_size=4",
        "parity.steps=1",
        "timing.warmup_steps=0",
        "timing.measured_steps=1",
        "budget.enabled=false",
        user_conf=True,
    )
    rows = distributed_checks(run)
    synced = [r for r in rows if r.role == Role.RANK_SYNC and r.extra.get("twin") == "plain"]
    assert any(r.status == Status.INCONCLUSIVE for r in synced), [(r.item, r.status, r.detail) for r in synced]
    said = [r for r in diagnose(rows, recompute_settings(run.setup)) if r.check == DIST_STEP_PARITY]
    assert said and said[0].extra["rule"] == "ranks drift without FSDP"
    assert "dp_replicate=2 × tp=2" in said[0].extra["cause"]
