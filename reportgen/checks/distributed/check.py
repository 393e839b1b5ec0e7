"""The recompute claim under sharding (``distributed.world_size > 1``): DDP or FSDP2 twins; what each section
compares and against what: docs/distributed.md, "Checks".

With world_size 1 the check adds no rows. Otherwise :func:`reportgen.distributed.ranks.run_sharded` runs
:data:`PARTS` on every rank (gradient parity: :mod:`reportgen.checks.distributed.grads`; step and
trajectory: :mod:`reportgen.checks.distributed.steps`; memory and time: :mod:`reportgen.checks.distributed.cost`;
task metrics: :mod:`reportgen.distributed.budget`); rank 0 gathers every rank's rows.
"""

from __future__ import annotations

from reportgen.checks.base import TRAINED_ROLES, Check, Section
from reportgen.checks.base.run import Run
from reportgen.checks.distributed.cost import memory_rows, time_rows
from reportgen.checks.distributed.grads import gradient_rows
from reportgen.checks.distributed.steps import step_rows, trajectory_rows
from reportgen.config import (
    DIST_GRADIENT_PARITY,
    DIST_MEMORY,
    DIST_STEP_PARITY,
    DIST_TASK_METRICS,
    DIST_TIME,
    DIST_TRAJECTORY,
)
from reportgen.distributed.budget import budget_rows
from reportgen.distributed.pipeline import PARTS as PIPELINE_PARTS
from reportgen.distributed.pipeline import pipelined
from reportgen.distributed.ranks import follow as ranks_follow
from reportgen.distributed.ranks import run_sharded
from reportgen.results import Role, Row
from reportgen.twins.setup import Setup


def distributed_checks(run: Run) -> list[Row]:
    """Every rank's rows of the sharded checks (none when ``distributed.world_size`` is 1), run by
    :func:`reportgen.distributed.ranks.run_sharded`: a rank that raised, crashed or hung gives ERROR rows naming
    it, and the parts it stopped NOT_RUN rows."""
    return run_sharded(run.setup, run.cfg, parts_of(run.setup))


def follow(setup: Setup) -> list[Row] | None:
    """This process's part as one rank of a torchrun/srun launch (every rank's rows on rank 0, None
    on the others); ``run`` calls it on ranks other than 0."""
    return ranks_follow(setup, parts_of(setup))


def parts_of(setup: Setup) -> tuple:
    """The parts every rank runs: :data:`PARTS`, or under pipeline stages (``distributed.mesh`` pp > 1) those of
    :mod:`reportgen.distributed.pipeline`."""
    return PIPELINE_PARTS if pipelined(setup.config.distributed) else PARTS


#: The parts every rank runs, in order (section, function); module-level functions, so a spawned rank
#: imports them by name.
PARTS = (
    (DIST_GRADIENT_PARITY, gradient_rows),
    (DIST_STEP_PARITY, step_rows),
    (DIST_TRAJECTORY, trajectory_rows),
    (DIST_MEMORY, memory_rows),
    (DIST_TIME, time_rows),
    (DIST_TASK_METRICS, budget_rows),
)

CHECK = Check(
    distributed_checks,
    (
        Section(
            DIST_GRADIENT_PARITY,
            "Sharded twins (distributed.strategy) on every rank's share of the same global "
            "batch: each rank's loss and outputs, then every parameter's full gradient, recompute vs the distributed "
            "plain twin; sharding's own effect (vs a single-process reference) is shown apart and advisory.",
            required=False,
            distributed=True,
            roles=(
                Role.LOSS,
                Role.OUTPUT,
                Role.PARAM_GRAD,
                Role.RANK_LOCAL_GRADS,
                Role.AA,
                Role.ZERO_GRADIENTS,
                Role.RANK_SYNC,
                Role.SHARDING_REFERENCE,
            ),
        ),
        Section(
            DIST_STEP_PARITY,
            "One optimizer step on the sharded twins: full parameters and optimizer state, and "
            "each rank's generator states after backward.",
            required=False,
            distributed=True,
            roles=(
                Role.PARAM,
                Role.OPTIMIZER_STATE,
                Role.BUFFER,
                Role.ATTRIBUTE,
                Role.RNG,
                Role.IGNORED,
                Role.AA,
                Role.RANK_SYNC,
                Role.SHARDING_REFERENCE,
            ),
        ),
        Section(
            DIST_TRAJECTORY,
            "Several optimizer steps of the sharded twins on the training stream, compared after "
            "every step (full parameters and optimizer state; each rank's buffers, attributes and generators).",
            required=False,
            distributed=True,
            roles=(Role.TRAJECTORY, Role.RANK_SYNC),
        ),
        Section(
            DIST_MEMORY,
            "Bytes autograd keeps for backward on each rank, and the maximum over ranks.",
            required=False,
            distributed=True,
            roles=(
                Role.RANK_SAVED_TOTAL,
                Role.RANK_STEP_PEAK,
                Role.MAX_RANK_SAVED_TOTAL,
                Role.MAX_RANK_STEP_PEAK,
                Role.NOTE,  # each rank's run peak (reportgen.distributed.ranks.peak_row)
            ),
        ),
        Section(
            DIST_TIME,
            "Warm training steps of the sharded twins; each step's time is the slowest rank's.",
            required=False,
            distributed=True,
            roles=(Role.RANK_STEP, Role.MAX_RANK_STEP, Role.MAX_RANK_OVERHEAD),
        ),
        Section(
            DIST_TASK_METRICS,
            "The sharded twins trained to the same global accepted-example budget (every rank "
            "trains on its share of each global batch; a step counts once, for all ranks), then evaluated on held-out "
            "data: the metric and every full trained parameter, recompute vs plain.",
            required=False,
            distributed=True,
            roles=(Role.BUDGET, *TRAINED_ROLES, Role.METRIC_DIFF, Role.FINAL_PARAMS),
        ),
    ),
)
