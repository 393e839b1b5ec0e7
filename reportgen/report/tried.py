"""Fixes that were tried, and the causes seen before the diagnosis is written (issue 43, item 6).

The diagnosis (:mod:`reportgen.report.diagnose`) proposes fixes; a fix that is a setting
(``recompute=non_reentrant``, ``recompute.preserve_rng_state=true``, ``distributed.ddp.static_graph=true``, ...) is
tried here before it is written: the failing fixed-batch checks (gradient parity, optimizer-step and state parity, and
their sharded twins: one forward and backward, one optimizer step) run again on the run's own setup with that one
setting changed, so the report says "tried: clears it" or "tried: still fails (...)" and a rule whose fix was tried and
failed is not the lead cause. Trajectories, budgets, memory and time are never re-run: a trial costs at most what the
fixed-batch checks cost once (its wall time is in the diagnosis), and at most :data:`MOST_TRIALS` settings are tried.

The causes two rules need are seen on the model, not guessed from a symptom
(:mod:`reportgen.twins.before_backward`): the regions whose inputs do not require grad (reentrant recompute's lost
gradients), and the attributes that differ before any backward (a flag the model's own switch sets).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import re
import time
import warnings
from collections.abc import Callable
from enum import Enum
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from reportgen.checks.base.run import Run
from reportgen.checks.distributed.grads import gradient_rows
from reportgen.checks.distributed.steps import step_rows
from reportgen.checks.parity.gradient import gradient_parity
from reportgen.checks.parity.step import step_and_state_parity
from reportgen.config import (
    DIST_GRADIENT_PARITY,
    DIST_STEP_PARITY,
    GRADIENT_PARITY,
    STATE_PARITY,
    STEP_PARITY,
    RecomputeMode,
)
from reportgen.distributed.launch import launched
from reportgen.distributed.ranks import run_sharded
from reportgen.limits import CheckLimitExceeded, check_limits, limited
from reportgen.report.diagnose import TOGETHER, Trial, proposed
from reportgen.report.diagnose_unexplained import BAD
from reportgen.results import Role, Row, Status
from reportgen.twins.before_backward import frozen_regions, set_before_backward
from reportgen.twins.recompute import is_model_switch
from reportgen.twins.setup import Setup

log = logging.getLogger("reportgen")

#: The fixed-batch checks of one process and the check function that gives their rows (one call gives both
#: optimizer-step and state parity).
SINGLE: dict[str, Callable[[Run], list[Row]]] = {
    GRADIENT_PARITY: gradient_parity,
    STEP_PARITY: step_and_state_parity,
    STATE_PARITY: step_and_state_parity,
}
#: The sharded fixed-batch checks and the part every rank runs for each (``reportgen.checks.distributed.check.PARTS``).
SHARDED: dict[str, Callable] = {DIST_GRADIENT_PARITY: gradient_rows, DIST_STEP_PARITY: step_rows}
#: Settings tried at most per run, in the order the rules propose them (each costs one run of the failing
#: fixed-batch checks).
MOST_TRIALS = 3
#: Statuses a re-run check still fails with.
STILL_FAILING = (*BAD, Status.NOT_RUN)
#: The keys a trial may change: how the regions recompute and how the sharded twins are wrapped. Never what is
#: measured or how (``distributed.world_size``, ``distributed.strategy``, tolerances, timeouts): a run on one rank
#: has no sharded rows, which is not a pass.
TRIABLE = re.compile(r"recompute(\.(mode|preserve_rng_state|determinism_check))?|distributed\.(ddp|fsdp|fsdp1)\.\w+")


def look_and_try(run: Run, rows: list[Row], settings: dict[str, Any]) -> dict[str, Any]:
    """What the diagnosis reads besides the rows: ``settings`` (:func:`reportgen.report.metadata.recompute_settings`)
    with ``switch`` (the model's own switch turns recompute on), and, where a rule needs them, ``frozen_regions``
    (under reentrant recompute with a failing fixed-batch check), ``set_before_backward`` (a failing attribute row)
    and ``tried``: ``{setting: Trial}`` for each setting a matching rule's fix proposes for a failing fixed-batch check
    (:func:`reportgen.report.diagnose.proposed`, at most :data:`MOST_TRIALS`).

    An observation or a trial that raises is logged and left out (a trial's row says it could not run): the
    diagnosis then reads the rows alone, as without this stage.
    """
    setup = run.setup
    seen = dict(settings) | {"switch": is_model_switch(setup.config.recompute)}
    failing = [c for c in dict.fromkeys(r.check for r in rows if r.status in BAD) if c in SINGLE or c in SHARDED]
    if settings.get("mode") == RecomputeMode.reentrant.value and failing:
        seen["frozen_regions"] = _observed(frozen_regions, setup, [])
    if any(r.role == Role.ATTRIBUTE and r.status in BAD for r in rows):
        seen["set_before_backward"] = _observed(set_before_backward, setup, {})
    tried: dict[str, Trial] = {}
    for setting in proposed(rows, seen, failing)[:MOST_TRIALS]:
        if (trial := try_setting(run, setting, failing)) is not None:
            tried[setting] = trial
    ran = [t.setting for t in tried.values() if not t.error]
    if len(ran) > 1 and all(any(tried[s].failing.values()) for s in ran):  # two faults at once: no fix clears alone
        if (together := try_settings(run, ran, failing)) is not None:
            tried[together.setting] = together
    return seen | {"tried": tried}


def _observed(observe: Callable[[Setup], Any], setup: Setup, empty: Any) -> Any:
    """``observe(setup)`` under the run's check limits; ``empty`` (and a log line) when it raises."""
    try:
        with warnings.catch_warnings(), limited(observe.__name__, *check_limits(setup.config)):
            warnings.simplefilter("ignore")
            return observe(setup)
    except (Exception, CheckLimitExceeded) as exc:  # noqa: BLE001 - evidence for a diagnosis, never a crash
        log.warning("diagnosis: %s could not run (%s)", observe.__name__, exc)
        return empty


def try_setting(run: Run, setting: str, failing: list[str]) -> Trial | None:
    """Re-run the failing fixed-batch checks of ``failing`` with ``setting`` changed, everything else as the run had
    it (the one build, the fixed batch, seeds, tolerances; the checks' own judges).

    Args:
        run: the run (its setup; its composed config, which spawned ranks build from).
        setting: ``recompute=<mode>`` (the mode alone changes) or ``<dotted key>=<value>`` of the config.
        failing: the failing checks; only those of :data:`SINGLE` and :data:`SHARDED` are re-run (and judged: state
            parity beside optimizer-step parity, which one function gives), a ``distributed.*`` setting re-runs only
            the sharded ones.

    Returns:
        The :class:`reportgen.report.diagnose.Trial`; None when the setting is not one a trial may change
        (:data:`TRIABLE`) or not one of this config's keys, is already in force, or none of ``failing`` is re-run for
        it.
    """
    return try_settings(run, [setting], failing)


def try_settings(run: Run, settings: list[str], failing: list[str]) -> Trial | None:
    """:func:`try_setting` with every one of ``settings`` changed at once (two faults, each hiding the other's cure:
    reentrant recompute of a frozen input *and* an RNG not replayed); the trial's ``setting`` joins them with " and "
    (:data:`reportgen.report.diagnose.TOGETHER`). None when any of them could not be tried alone."""
    changed: tuple[Setup, DictConfig | None] | None = (run.setup, run.cfg)
    for setting in settings:
        changed = _changed(*changed, setting) if changed is not None else None
    setting = TOGETHER.join(settings)
    sharded = [c for c in failing if c in SHARDED]
    only_sharded = all(s.startswith("distributed.") for s in settings)
    rerun = set() if only_sharded else {SINGLE[c] for c in failing if c in SINGLE}
    single = [c for c, check in SINGLE.items() if check in rerun]  # every check a re-run function judges
    if changed is None or not (single or sharded):
        return None
    checks = (*single, *sharded)
    start = time.perf_counter()
    if sharded and launched():
        why = "under a torchrun/srun launch the other ranks have left when the diagnosis runs"
        return Trial(setting=setting, checks=checks, failing={}, seconds=0.0, error=why)
    log.info("diagnosis: trying %s (re-running %s at the fixed batch)", setting, ", ".join(checks))
    try:
        with warnings.catch_warnings(), limited(f"trying {setting}", *check_limits(run.setup.config)):
            warnings.simplefilter("ignore")
            got = _rerun(Run(*changed), single, sharded)
    except (Exception, CheckLimitExceeded) as exc:  # noqa: BLE001 - a trial that raises concludes nothing
        log.warning("diagnosis: trying %s raised (%s)", setting, exc)
        error = f"{type(exc).__name__}: {str(getattr(exc, 'message', exc)).splitlines()[0][:160]}"
        return Trial(setting=setting, checks=checks, failing={}, seconds=time.perf_counter() - start, error=error)
    still = {c: [r.item for r in got if r.check == c and r.status in STILL_FAILING] for c in checks}
    still |= {c: ["no rows"] for c in checks if not any(r.check == c for r in got)}  # nothing measured is no pass
    return Trial(setting=setting, checks=checks, failing=still, seconds=time.perf_counter() - start)


def _rerun(run: Run, single: list[str], sharded: list[str]) -> list[Row]:
    """The rows of the single-process checks ``single`` (each check function once) and the sharded ``sharded``."""
    rows: list[Row] = []
    for check in dict.fromkeys(SINGLE[c] for c in single):
        rows += check(run)
    if sharded:
        rows += run_sharded(run.setup, run.cfg, [(c, SHARDED[c]) for c in sharded])
    return rows


def _changed(setup: Setup, cfg: DictConfig | None, setting: str) -> tuple[Setup, DictConfig | None] | None:
    """``(setup, cfg)`` with ``setting`` applied, both the typed config and the composed one; None when the key is not
    in the config or the value is already in force."""
    key, _, text = setting.partition("=")
    if not TRIABLE.fullmatch(key):
        return None
    key = "recompute.mode" if key == "recompute" else key  # the group's choice: the mode it names
    *path, name = key.split(".")
    try:
        current = getattr(functools.reduce(getattr, path, setup.config), name)
        value = _value(key, text, current)
    except (AttributeError, ValueError):
        return None
    if value == current:
        return None
    config = _replaced(setup.config, key.split("."), value)
    mode = {"mode": value} if key == "recompute.mode" else {}
    trial = dataclasses.replace(setup, config=config, **mode)
    if cfg is None:
        return trial, None
    composed = copy.deepcopy(cfg)
    OmegaConf.update(composed, key, value.value if isinstance(value, Enum) else value)
    return trial, composed


def _value(key: str, text: str, current: Any) -> Any:
    """The value ``text`` sets at ``key``, typed as the config holds it (an enum member, else what Hydra's override
    parser reads, as on the command line).

    Raises:
        ValueError: not a member of the key's enum.
    """
    if key == "recompute.mode":
        return RecomputeMode(text)
    if isinstance(current, Enum):
        return type(current)(text)
    return OverridesParser.create().parse_override(f"{key}={text}").value()  # as the command line reads it


def _replaced(record: Any, path: list[str], value: Any) -> Any:
    """A copy of the dataclass ``record`` with the field at ``path`` set to ``value`` (the records on the way copied)."""
    head, *rest = path
    return dataclasses.replace(record, **{head: _replaced(getattr(record, head), rest, value) if rest else value})
