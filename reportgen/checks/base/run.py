"""What lives for the run, handed to every check: the frozen :class:`reportgen.twins.setup.Setup` and the state the
checks share, made once by the pipeline (as deepchecks' ``Suite.run`` builds one ``Context`` and hands it to every
check). Records stay frozen; the run owns what changes."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from reportgen.memory.device_peak import PhasePeak
from reportgen.training.train import BudgetRuns
from reportgen.twins.setup import Setup


@dataclass
class Run:
    """The run every check gets (:attr:`reportgen.checks.base.Check.run` is ``fn(run) -> rows``).

    Attributes:
        setup: the run's frozen inputs (typed config, task, the one build, the fixed batch, the training step).
        cfg: the composed ``DictConfig``, for the rank launcher alone (a spawned rank composes it again); None
            where no rank is spawned (a test that calls a check directly).
        budget_runs: the budget training runs, each trained once per run and read by the task-metrics check and
            the larger-batch experiment (:class:`reportgen.training.train.BudgetRuns`).
        phase_peaks: each check's own peak, in run order (the pipeline measures them; the run-peak row names the
            phase that reached the run's peak).
    """

    setup: Setup
    cfg: DictConfig | None = None
    budget_runs: BudgetRuns = field(default_factory=BudgetRuns)
    phase_peaks: list[PhasePeak] = field(default_factory=list)
