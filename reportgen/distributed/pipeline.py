"""Pipeline stages (``distributed.mesh={pp:N}``): each twin cut into stages at ``distributed.pipeline.split`` and
trained by a ``torch.distributed.pipelining`` schedule, as torchtitan's ``pipeline_llm`` builds them
(torchtitan/distributed/pipeline_parallel.py).

How a twin is built, the same for both twins (:func:`stage_twin`):

1. a plain build of the model is traced into stages by ``torch.distributed.pipelining.pipeline`` with a
   ``SplitPoint.BEGINNING`` at each split path (torch.export; parameter names are the model's own);
2. in this rank's stage, the module at each recompute target's path is replaced by the twin's own eager module
   (``Setup.build(recompute)``: the recompute twin's ``checkpoint_wrapper``, the plain twin's plain module), so
   recompute runs inside the stage exactly as the single-process twin runs it;
3. ``Pipe.build_stage`` makes the ``PipelineStage``, and ``distributed.pipeline.schedule`` (GPipe, 1F1B) drives it
   with ``distributed.pipeline.microbatches`` micro-batches and the task's loss on the last stage.

Every rank holds one stage, and the tensors of that stage only: gradients, parameters and optimizer state are
compared by name on the rank that owns them (rows carry ``stage`` and ``rank``); no tensor is replicated across
ranks, so nothing is compared across stages. The loss is the last stage's (mean over micro-batches), broadcast.
The parts here (:data:`PARTS`) are what ``reportgen.checks.distributed`` runs on every rank under pipeline stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from reportgen.config import (
    DIST_GRADIENT_PARITY,
    DIST_MEMORY,
    DIST_STEP_PARITY,
    DIST_TASK_METRICS,
    DIST_TIME,
    DIST_TRAJECTORY,
    STATE_PARITY,
)
from reportgen.distributed.launch import Group
from reportgen.distributed.mesh import layout_of
from reportgen.distributed.ranks import ranked
from reportgen.results import Role, Row, Status
from reportgen.results.compared import tensor_row
from reportgen.results.raised import raised_in
from reportgen.results.rows import aa_row, step_row, zero_gradients_row
from reportgen.structure import batch_size_of, map_tensors
from reportgen.tasks import Batch
from reportgen.training.trajectory import trajectory
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import Snapshot, snapshot_rows, take
from reportgen.twins.step import TrainingStep
from reportgen.twins.twin import Twin

#: ``distributed.pipeline.schedule`` → torch's schedule class name (one stage per rank).
SCHEDULES = {"GPipe": "ScheduleGPipe", "1F1B": "Schedule1F1B"}
#: Schedules torch has that reportgen does not build yet (several stages per rank).
NOT_BUILT = ("Interleaved1F1B",)
#: Sharded checks not built for pipeline stages: each gives one NOT_RUN row saying so.
NOT_BUILT_SECTIONS = (DIST_MEMORY, DIST_TIME, DIST_TASK_METRICS)


def pp_degree(dc: Any) -> int:
    """The number of pipeline stages of ``cfg.distributed``: ``distributed.mesh``'s ``pp`` (1 when unset, or when the
    mesh is malformed: :func:`reportgen.distributed.mesh.mesh_problems` refuses it)."""
    try:
        return layout_of(dc).degree("pp")
    except (TypeError, ValueError):
        return 1


def pipelined(dc: Any) -> bool:
    """True when the twins run as pipeline stages (``pp`` > 1)."""
    return pp_degree(dc) > 1


def pipeline_problems(cfg: Any) -> list[str]:
    """Every reason a run with pipeline stages cannot start (empty when ``pp`` ≤ 1 and ``distributed.pipeline`` is
    left at its defaults, or when it is fine), each one line naming the fix; what is not built is refused here,
    before anything runs, never recorded and ignored.

    Args:
        cfg: the composed config (``DictConfig``).
    """
    dc, pc = cfg.distributed, cfg.distributed.pipeline
    pp, split = pp_degree(dc), [str(s) for s in pc.split]
    if pp <= 1:
        return (
            [] if not split else [f"distributed.pipeline.split={split} needs distributed.mesh={{pp:{len(split) + 1}}}"]
        )
    problems = []
    if str(pc.schedule) not in SCHEDULES:
        built = ", ".join(SCHEDULES)
        why = "several stages per rank are not built yet" if str(pc.schedule) in NOT_BUILT else "unknown schedule"
        problems.append(f"distributed.pipeline.schedule={pc.schedule} ({why}); use one of {built}")
    if len(split) != pp - 1:
        problems.append(
            f"distributed.pipeline.split={split} gives {len(split) + 1} stage(s) but distributed.mesh has pp={pp}; "
            f"name {pp - 1} module path(s) where stages 1..{pp - 1} begin, e.g. [blocks.1]"
        )
    if pp != int(dc.world_size):
        problems.append(
            f"distributed.mesh with pp={pp} and other dimensions: pipeline stages combined with data, tensor or "
            f"context parallelism are not built yet; use distributed.mesh={{pp:{dc.world_size}}}"
        )
    strategy = getattr(dc.strategy, "value", str(dc.strategy))
    if strategy != "ddp" or dc.get("wrap") is not None:
        problems.append(
            f"distributed.strategy={strategy} with pipeline stages: every stage lives on one rank (nothing to shard "
            "or replicate); leave distributed.strategy at its default"
        )
    micro, batch = int(pc.microbatches), int(cfg.parity.batch_size)
    if micro < 1 or batch % micro:
        problems.append(f"distributed.pipeline.microbatches={micro} must be ≥ 1 and divide parity.batch_size={batch}")
    if cfg.precision.autocast is not None or getattr(cfg.recompute.method, "value", cfg.recompute.method) != "wrap":
        problems.append(
            "pipeline stages are built with recompute.method=wrap and no precision.autocast; "
            "set recompute.method=wrap precision.autocast=null"
        )
    required = cfg.verdict.required
    named = [s for s in NOT_BUILT_SECTIONS if required is None or s in required]
    if named:
        problems.append(
            f"the sharded checks {', '.join(named)} are not built for pipeline stages, so a claim that requires them "
            "cannot hold; set verdict.required to the checks the claim needs (e.g. "
            f"'verdict.required=[gradient parity,{DIST_GRADIENT_PARITY},{DIST_STEP_PARITY},{DIST_TRAJECTORY}]')"
        )
    return problems


@dataclass(frozen=True)
class PipelineStep(TrainingStep):
    """reportgen's training step through a pipeline schedule: ``schedule.step`` on this rank's stage (inputs on the
    first stage, targets and the task's loss on the last), gradients scaled by ``1 / microbatches`` (torch's
    ``scale_grads``), then the configured optimizer over this stage's parameters.

    Attributes:
        schedule: the ``torch.distributed.pipelining`` schedule driving this rank's stage.
        first: this rank holds the first stage (it feeds the inputs).
        last: this rank holds the last stage (it computes the loss).
        last_rank: the rank of the last stage (the loss is broadcast from it).
    """

    schedule: Any = None
    first: bool = False
    last: bool = False
    last_rank: int = 0

    def forward_backward(self, model: nn.Module, batch: Batch) -> Tensor:
        """One schedule step (every micro-batch's forward and backward). Returns the mean micro-batch loss
        (detached, 0-d), the last stage's, on every rank."""
        inputs, targets = batch
        losses: list[Tensor] = []
        kwargs = {"target": targets, "losses": losses} if self.last else {}
        self.schedule.step(*((inputs,) if self.first else ()), **kwargs)
        loss = torch.stack([x.detach() for x in losses]).mean() if self.last else torch.zeros((), device=inputs.device)
        dist.broadcast(loss, src=self.last_rank)
        return loss

    def forwards(self, model: nn.Module, batch: Batch) -> Tensor:
        """Not built: counting saved activations runs no pipeline schedule (the memory checks are not run)."""
        raise NotImplementedError("saved activations are not counted through a pipeline schedule")


def _microbatch(inputs: Any, microbatches: int) -> Any:
    """The first of ``microbatches`` equal micro-batches of ``inputs`` (what the stages are traced on)."""
    per = batch_size_of(inputs) // microbatches
    return map_tensors(lambda t: t[:per] if t.dim() else t, inputs)


def stage_twin(setup: Setup, group: Group, recompute: bool) -> Twin:
    """This rank's stage of a fresh twin with its schedule and optimizer (module docstring, steps 1-3).

    Returns:
        A :class:`Twin` whose model is this rank's stage module (parameters named as in the whole model, recompute
        wrappers' segment aside) and whose step is a :class:`PipelineStep`.

    Raises:
        ValueError: the task's own training step (a schedule runs reportgen's only), a split path that is not a
            module, or a recompute target that holds a split point (a region cannot span two stages).
    """
    from torch.distributed import pipelining

    pc = setup.config.distributed.pipeline
    if type(setup.training_step) is not TrainingStep:
        raise ValueError("the task's own training step cannot run through a pipeline schedule; reportgen's runs")
    split = [str(s) for s in pc.split]
    for w in setup.wrapped:
        if inside := [s for s in split if s.startswith(w.path + ".")]:
            raise ValueError(f"recompute target {w.path} holds split point {inside[0]}: a region cannot span stages")
    inputs = setup.batch[0]
    pipe = pipelining.pipeline(
        setup.build(False),
        mb_args=(_microbatch(inputs, int(pc.microbatches)),),
        split_spec={path: pipelining.SplitPoint.BEGINNING for path in split},
    )
    if pipe.num_stages != len(split) + 1:
        raise ValueError(f"distributed.pipeline.split={split} made {pipe.num_stages} stages, not {len(split) + 1}")
    module, eager = pipe.get_stage_module(group.rank), setup.build(recompute)
    for w in setup.wrapped:
        parent, _, name = w.path.rpartition(".")
        held = _submodule(module, parent)
        if held is not None and hasattr(held, name):
            held.register_module(name, eager.get_submodule(w.path))  # the twin's own region, recompute inside
    stage = pipe.build_stage(group.rank, group.device)
    schedule = getattr(pipelining, SCHEDULES[str(pc.schedule)])(
        stage, n_microbatches=int(pc.microbatches), loss_fn=setup.task.loss
    )
    step = PipelineStep(setup.task, schedule, stage.is_first, stage.is_last, pipe.num_stages - 1)
    return Twin.of(stage.submod, step, setup.config.parity.optimizer)


def _submodule(module: nn.Module, path: str) -> nn.Module | None:
    """``module.get_submodule(path)``, or None when this stage does not hold it."""
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def _staged(rows: list[Row], rank: int) -> list[Row]:
    """``rows`` with this rank's ``stage`` and ``rank`` columns (stage ``i`` lives on rank ``i``)."""
    for row in rows:
        row.extra["stage"] = rank
    return [ranked(row, rank) for row in rows]


def _reference(rows_of: str, names: set[str], reference: dict[str, Tensor | None], stepped: dict, rtol, atol):
    """Advisory rows (WARN on a miss): this stage's tensors of each pipelined twin vs the single-process plain twin
    on the whole batch at once (micro-batches and each stage's own generator draws are the pipeline's own effect)."""
    rows = []
    for variant, values in stepped.items():
        for name in sorted(names):
            item = f"{name} ({variant}, pipeline vs single-process)"
            row = tensor_row(rows_of, item, reference.get(name), values.get(name), rtol, atol, Role.SHARDING_REFERENCE)
            row.variant, row.on_miss = variant, Status.WARN
            row.__post_init__()  # judged again by results.judge with the advisory on_miss
            rows.append(row)
    return rows


def _sync_said(check: str, world_size: int) -> Row:
    """Rank 0's INFO row: under pipeline stages no tensor is held by two ranks, so no rank sync is compared."""
    detail = (
        f"not compared: each of the {world_size} stages' parameters, gradients and optimizer state live on its own "
        "rank only (stage i on rank i), so no tensor is replicated across ranks; each stage is compared by name above"
    )
    return Row.fact(check, "rank sync (pipeline stages)", Role.RANK_SYNC, detail, metric="tensors_out_of_sync")


def gradient_rows(setup: Setup, group: Group) -> list[Row]:
    """One schedule step's backward of the pipelined plain, A/A and recompute twins on the whole global batch.

    Returns:
        Per rank (columns ``rank``, ``stage``): every gradient of this stage, recompute vs plain with the A/A twin,
        the A/A row, the all-zero-gradient gate, and (advisory) both twins vs the single-process plain twin; on the
        last stage's rank the loss; on rank 0 the rank-sync INFO row.
    """
    rtol, atol = setup.tolerance()
    seed, runs = setup.config.forward_seed, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            twin = stage_twin(setup, group, recompute)
            runs[name] = twin.step(setup.batch, seed, accept=False, keep_grads=True)
    plain, aa, rc = runs["plain"], runs["aa"], runs["recompute"]
    rows = []
    if group.rank == group.world_size - 1:
        rows.append(
            tensor_row(
                DIST_GRADIENT_PARITY, "loss (last stage)", plain.loss, rc.loss, rtol, atol, Role.LOSS, aa=aa.loss
            )
        )
    for n in sorted(set(plain.grads) | set(rc.grads)):
        p, r, a = plain.grads.get(n), rc.grads.get(n), aa.grads.get(n)
        rows.append(
            tensor_row(DIST_GRADIENT_PARITY, f"{n}.grad (stage {group.rank})", p, r, rtol, atol, Role.PARAM_GRAD, aa=a)
        )
    rows += [aa_row(DIST_GRADIENT_PARITY, rows), zero_gradients_row(DIST_GRADIENT_PARITY, plain.grads)]
    reference = setup.twin(False).step(setup.batch, seed, accept=False, keep_grads=True).grads
    grads = {"plain": plain.grads, "recompute": rc.grads}
    keyed = {v: {f"{n}.grad": g for n, g in values.items()} for v, values in grads.items()}
    names = {f"{n}.grad" for n in plain.grads}
    rows += _reference(DIST_GRADIENT_PARITY, names, {f"{n}.grad": g for n, g in reference.items()}, keyed, rtol, atol)
    rows = _staged(rows, group.rank)
    return rows + ([_sync_said(DIST_GRADIENT_PARITY, group.world_size)] if group.rank == 0 else [])


def _staged_snapshot_rows(
    check: str, plain: Snapshot, rc: Snapshot, aa: Snapshot, setup: Setup, rank: int
) -> list[Row]:
    """:func:`reportgen.twins.snapshot.snapshot_rows` of one stage, every row in ``check`` naming the stage."""
    rtol, atol = setup.tolerance()
    rows = snapshot_rows(plain, rc, aa, rtol, atol, setup.config.state.ignore_attributes)
    for row in rows:
        if row.check != STATE_PARITY:
            row.item += f" (stage {rank})"
        row.check = check
    return rows


def step_rows(setup: Setup, group: Group) -> list[Row]:
    """One optimizer step (``parity.optimizer``, one per stage over its own parameters) of the pipelined plain, A/A
    and recompute twins.

    Returns:
        Per rank (``rank``, ``stage``): this stage's parameters and optimizer state (recompute vs plain, with the
        A/A twin), its buffers, module attributes and generator states (:func:`reportgen.twins.snapshot.snapshot_rows`),
        the A/A row, and (advisory) the parameters vs one step of the single-process plain twin.
    """
    seed, snaps = setup.config.forward_seed, {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            twin = stage_twin(setup, group, recompute)
            twin.step(setup.batch, seed)
            snaps[name] = twin.snapshot()
    rows = _staged_snapshot_rows(DIST_STEP_PARITY, snaps["plain"], snaps["recompute"], snaps["aa"], setup, group.rank)
    rows.append(aa_row(DIST_STEP_PARITY, rows))
    reference = setup.twin(False)
    reference.step(setup.batch, seed)
    ref = reference.snapshot().params
    stepped = {"plain": snaps["plain"].params, "recompute": snaps["recompute"].params}
    rtol, atol = setup.tolerance()
    keyed = {v: {f"param {n}": t for n, t in values.items()} for v, values in stepped.items()}
    names = {f"param {n}" for n in snaps["plain"].params}
    rows += _reference(DIST_STEP_PARITY, names, {f"param {n}": t for n, t in ref.items()}, keyed, rtol, atol)
    return _staged(rows, group.rank)


def _trajectory(setup: Setup, group: Group, recompute: bool) -> list[Snapshot]:
    """``parity.steps`` optimizer steps of one pipelined twin on the training stream (the single-process
    trajectory's own loop: same batches and per-step seeds), a copy of this stage's state after each."""
    twin = stage_twin(setup, group, recompute)
    copy = lambda t: take(t.model, t.optimizer, t.last.rng, t.last.loss)  # a copy: the twin steps on
    return list(trajectory(setup, recompute, twin=twin, snapshot=copy))


def trajectory_rows(setup: Setup, group: Group) -> list[Row]:
    """The pipelined plain, A/A and recompute twins, ``parity.steps`` steps each, compared after every step.

    Returns:
        Per step and rank (``rank``, ``stage``): one ``recompute`` row (``allclose`` on the worst excess over every
        item of this stage: parameters, optimizer state, buffers, attributes, generators) and one ``aa`` row
        (INCONCLUSIVE when missed).
    """
    runs = {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with raised_in(name):
            runs[name] = _trajectory(setup, group, recompute)
    rows = []
    for k, (p, a, r) in enumerate(zip(runs["plain"], runs["aa"], runs["recompute"]), start=1):
        compared = [
            x for x in _staged_snapshot_rows(DIST_TRAJECTORY, p, r, a, setup, group.rank) if x.role != Role.IGNORED
        ]
        for variant, key, on_miss in (("recompute", "excess", Status.FAIL), ("aa", "aa_excess", Status.INCONCLUSIVE)):
            excess = [(float(x.extra.get(key, math.inf)), x) for x in compared]
            moved = [x.item for e, x in excess if not e <= 0]
            worst = max((e for e, _ in excess), key=lambda e: e if e == e else math.inf, default=0.0)
            extra = {"step": k, "excess": worst, "items": len(compared)}
            rows.append(
                step_row(
                    DIST_TRAJECTORY, k, "items_outside_tolerance", len(moved), "items", variant, on_miss, moved, extra
                )
            )
    return _staged(rows, group.rank)


def not_built_rows(setup: Setup, group: Group) -> list[Row]:
    """Rank 0's NOT_RUN row for each sharded check not built for pipeline stages (:data:`NOT_BUILT_SECTIONS`; a
    claim cannot require them: :func:`pipeline_problems`)."""
    detail = "not run: not built for pipeline stages (distributed.mesh pp > 1); the single-process check measures it"
    return [Row.not_run(name, detail) for name in NOT_BUILT_SECTIONS] if group.rank == 0 else []


#: The parts every rank runs under pipeline stages, in order (section, function), as
#: ``reportgen.checks.distributed.check.PARTS`` without pipeline stages.
PARTS = (
    (DIST_GRADIENT_PARITY, gradient_rows),
    (DIST_STEP_PARITY, step_rows),
    (DIST_TRAJECTORY, trajectory_rows),
    (DIST_MEMORY, not_built_rows),
)
