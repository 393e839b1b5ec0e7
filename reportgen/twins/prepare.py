"""The stages before any check, the same for one process and for every rank of a sharded run:
build the twins from one ``state_dict``, probe the task contract, draw the fixed batch, observe which
modules recompute (under the checks' deadline and memory ceiling)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import torch
from omegaconf import DictConfig

from reportgen.errors import SetupError
from reportgen.limits import CheckLimitExceeded, check_limits, limited
from reportgen.twins.contract import check_task_contract
from reportgen.twins.observe import observe_twins
from reportgen.twins.setup import Setup, build_setup

log = logging.getLogger("reportgen")


def prepare(
    cfg: DictConfig,
    *,
    probe_contract: bool = True,
    device_problem: Callable[[torch.device], str] = lambda device: "",
    rank: bool = False,
) -> Setup:
    """Build, probe, draw the batch and observe the twins.

    Args:
        cfg: the composed config.
        probe_contract: probe the task contract (a spawned rank skips it: the launching process
            already did, with the same task).
        device_problem: ``fn(device) -> why this device cannot serve the run`` ("" when it can);
            checked right after the twins are built, before any batch is drawn.
        rank: a spawned rank of a sharded run: a meta-device build stays on the meta device (each twin is
            materialised per shard) and the twins are not observed (the launching process observed them; a rank
            holds no whole twin).

    Raises:
        SetupError: the model or task cannot be built, the task breaks its contract
            (``reportgen.twins.contract.TaskContractError``), or ``device_problem`` names a problem.
        RecomputeConfigError: the recompute settings cannot be applied to this model.
    """
    setup = build_setup(cfg, keep_meta=rank)
    if problem := device_problem(setup.device):
        raise SetupError(problem)
    if probe_contract:
        check_task_contract(setup)  # before any batch is used (exit 2 on a breach)
    setup = replace(setup, batch=setup.make_batch(setup.config.parity.batch_size, setup.config.seed))
    if rank:
        return setup
    try:  # which modules recompute in each twin, and whether compile can run them; under the checks' limits
        with limited("observing which modules recompute", *check_limits(cfg)):
            setup = replace(setup, **observe_twins(setup))
    except CheckLimitExceeded as exc:  # a region that never returns: the checks each end as an ERROR row
        log.error("%s", exc.message)
    return setup
