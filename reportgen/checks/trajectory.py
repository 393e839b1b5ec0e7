"""Trajectory parity: several optimizer steps on the training stream, compared after every step.

One-step parity on fresh twins misses faults that leave step 1 bitwise equal and show from
step 2 on: state that the forward reads and then updates (an observer, a running scale, a
counter) updated twice per step under recomputation. Here the plain twin, a second plain
twin built independently (A/A) and the recompute twin each take ``parity.steps`` steps of
``parity.optimizer`` on the same batches (drawn from the task with ``seed``), every random
generator seeded identically before each forward; after every step parameters, optimizer
state, buffers, plain module attributes and generator states are compared.
"""
from __future__ import annotations

import math

import torch
from hydra.utils import instantiate

from ..config import TRAJECTORY
from ..plots import trajectory_plots
from ..results import INCONCLUSIVE, INFO, Role, Row
from ..rng import fingerprint, seeded
from ..rows import run_twin
from ..setup import Setup
from ..snapshot import Snapshot, snapshot_rows, take
from ..structure import call_model
from ..tasks import batch_to
from ..train import step_seed
from .base import Check, Section


def trajectory(setup: Setup, recompute: bool) -> list[Snapshot]:
    """Train a fresh twin for ``parity.steps`` steps on the training stream; a snapshot after each.

    Batches: ``task.make_batch`` with a generator seeded by ``cfg.seed``, ``parity.batch_size``
    examples each; before step ``k``'s forward every generator is seeded with
    ``step_seed(forward_seed, cfg.seed, k)`` (the same for every twin).
    """
    cfg = setup.cfg
    model = setup.build(recompute)
    optimizer = instantiate(cfg.parity.optimizer, params=[p for p in model.parameters() if p.requires_grad])
    generator = torch.Generator().manual_seed(int(cfg.seed))
    snaps = []
    for k in range(int(cfg.parity.steps)):
        x, y = batch_to(setup.task.make_batch(generator, int(cfg.parity.batch_size)), setup.device, setup.dtype)
        optimizer.zero_grad(set_to_none=True)
        with seeded(None if cfg.forward_seed is None else step_seed(cfg.forward_seed, cfg.seed, k)):
            loss = setup.task.loss(call_model(model, x), y)
            loss.backward()
            rng = fingerprint()
        optimizer.step()
        snaps.append(take(model, optimizer, rng, loss))
    return snaps


def step_rows(step: int, rows: list[Row]) -> list[Row]:
    """Two rows for one step: recompute vs plain (judged ``allclose`` on the worst excess over
    every compared item) and A/A vs plain (judged the same way, INCONCLUSIVE when missed)."""
    out = []
    for variant, key, on_miss in (("recompute", "excess", "FAIL"), ("aa", "aa_excess", INCONCLUSIVE)):
        excess = [(r.extra.get(key, math.inf), r) for r in rows]
        worst_excess, worst = max(excess, key=lambda e: (not e[0] <= 0, e[0] if e[0] == e[0] else math.inf))
        moved = [r.item for e, r in excess if not e <= 0]
        rel = [r.extra.get("max_rel_err", 0.0) if variant == "recompute" else
               (0.0 if r.extra.get("aa_excess", 0.0) <= 0 else r.extra.get("aa_max_abs_err", math.inf)) for r in rows]
        largest = max((v for v in rel if v == v), default=0.0)
        detail = (f"all {len(rows)} items within tolerance" if not moved else
                  f"{len(moved)} of {len(rows)} items outside tolerance, e.g. {', '.join(moved[:3])}")
        metric = "max_rel_err" if variant == "recompute" else "aa_max_abs_err"
        out.append(Row(TRAJECTORY, f"step {step}", variant, metric, largest, "allclose per item", "allclose",
                       detail=detail, role=Role.TRAJECTORY, on_miss=on_miss,
                       extra={"step": step, "excess": worst_excess, "worst_item": worst.item, "items": len(rows),
                              "items_outside": len(moved)}))
    return out


def trajectory_parity(setup: Setup) -> list[Row]:
    """Run the three trajectories and compare them step by step.

    Returns:
        Per step, a ``recompute`` row and an ``aa`` row (see :func:`step_rows`), and one
        ``first_diverging_step`` row (INFO: the first step at which recompute leaves tolerance,
        0 when none, naming the items).
    """
    snaps = {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        snaps[name], errors = run_twin(TRAJECTORY, "plain" if name == "aa" else name,
                                       lambda r=recompute: trajectory(setup, r))
        if errors:
            return errors
    rtol, atol = setup.tolerance()
    out: list[Row] = []
    first, first_items = 0, []
    for k, (p, a, r) in enumerate(zip(snaps["plain"], snaps["aa"], snaps["recompute"]), start=1):
        rows = [x for x in snapshot_rows(p, r, a, rtol, atol, list(setup.cfg.state.ignore_attributes))
                if x.role != Role.IGNORED]
        out += step_rows(k, rows)
        if not first and not out[-2].status == "PASS":
            first, first_items = k, [x.item for x in rows if not x.extra.get("excess", 0.0) <= 0]
    steps = len(snaps["plain"])
    detail = (f"recompute stays within tolerance of plain for all {steps} steps" if not first else
              f"recompute first leaves tolerance at step {first} of {steps}: {', '.join(first_items[:4])}"
              + (f" and {len(first_items) - 4} more" if len(first_items) > 4 else "")
              + ("; step 1 was equal, so the fault shows only after a step: state read in forward and updated after it"
                 if first > 1 else ""))
    out.append(Row(TRAJECTORY, "first diverging step", "recompute", "first_diverging_step", float(first),
                   status=INFO, detail=detail, role=Role.FIRST_DIVERGENCE, unit="step",
                   extra={"steps": steps, "first_items": ", ".join(first_items[:8])}))
    return out


CHECK = Check(trajectory_parity, (Section(
    TRAJECTORY, "Several optimizer steps on the training stream for the plain twin, a second plain twin (A/A) and the "
    "recompute twin, compared after every step: parameters, optimizer state, buffers, module attributes and generator "
    "states.", template="sections/trajectory-parity.html.j2", plotter=trajectory_plots),))
