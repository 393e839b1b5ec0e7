"""The check registry: one :class:`Check` record per check, read by the pipeline, the report, the plots, config
validation and signing (what a check is, and how checks share code: docs/architecture.md, "The check registry")."""

from __future__ import annotations

from reportgen.checks import budget, larger_batch, policy
from reportgen.checks.base import PIPELINE_ROLES, ROWS_TEMPLATE, Check, Section
from reportgen.checks.controls import check as controls_check
from reportgen.checks.distributed import check as distributed_check
from reportgen.checks.memory import check as memory_check
from reportgen.checks.parity import gradient, step, trajectory
from reportgen.checks.timing import check as timing_check
from reportgen.results import Kind, Role

#: Every check, in checklist (and report) order.
REGISTRY: list[Check] = [
    gradient.CHECK,
    step.CHECK,
    trajectory.CHECK,
    policy.CHECK,
    memory_check.CHECK,
    timing_check.CHECK,
    budget.CHECK,
    larger_batch.CHECK,
    distributed_check.CHECK,
    controls_check.CHECK,  # last: it controls the checks above
]


def sections() -> list[Section]:
    """Every section of every registered check, in report order."""
    return [s for check in REGISTRY for s in check.sections]


def section(name: str) -> Section | None:
    """The registered section called ``name``, or None (e.g. a check name no check produces)."""
    return next((s for s in sections() if s.name == name), None)


def default_required(distributed: bool = False) -> list[str]:
    """Names of the sections that are required by default (every one but flagged experiments
    and those marked ``required=False``); with ``distributed`` (``distributed.world_size > 1``)
    the sharded checks' sections too."""
    return [s.name for s in sections() if (s.required or (distributed and s.distributed)) and not s.flagged]


def required_names(configured: list[str] | None, distributed: bool = False) -> list[str]:
    """``verdict.required`` as a list: the configured names, or (null) :func:`default_required`."""
    return default_required(distributed) if configured is None else [str(name) for name in configured]


def run_order(registry: list[Check], distributed: bool, joined: bool) -> list[Check]:
    """The checks a run runs, in order.

    Args:
        registry: the registered checks, in report order.
        distributed: ``distributed.world_size > 1``; without it the sharded checks are left out.
        joined: inside a torchrun/srun launch: the sharded checks run first, so every rank meets
            rank 0 in their first collective before rank 0 spends time on single-process checks.
    """
    sharded = [c for c in registry if any(s.distributed for s in c.sections)]
    rest = [c for c in registry if c not in sharded]
    if not distributed:
        return rest
    return sharded + rest if joined else list(registry)


def flagged_names() -> set[str]:
    """Names of the flagged experiments (their rows never count toward the verdict)."""
    return {s.name for s in sections() if s.flagged}


def roles_of(kind: Kind) -> frozenset[Role]:
    """The roles of ``kind`` that the registered checks' sections declare (:attr:`Section.roles`),
    e.g. ``roles_of(Kind.PARITY)``: the rows the verifier re-judges as required parity."""
    return frozenset(r for s in sections() for r in s.roles if r.kind is kind)


def declared_roles(name: str) -> frozenset[Role]:
    """Every role a row of the registered section ``name`` may carry: the roles it declares and
    :data:`PIPELINE_ROLES` (empty of its own for a name no check produces)."""
    found = section(name)
    return frozenset((*(found.roles if found else ()), *PIPELINE_ROLES))


__all__ = [
    "PIPELINE_ROLES",
    "Check",
    "REGISTRY",
    "ROWS_TEMPLATE",
    "Section",
    "declared_roles",
    "default_required",
    "flagged_names",
    "required_names",
    "roles_of",
    "run_order",
    "section",
    "sections",
]
