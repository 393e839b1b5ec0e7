"""Gradient parity at every step of a budget run, at identical weights (asked by the task-metrics
check only when the trained parameters differ)."""

from __future__ import annotations

import math

import torch

from reportgen.config import BudgetConfig
from reportgen.rng import drawn_from, seed_all
from reportgen.structure import batch_size_of
from reportgen.tasks import batch_to
from reportgen.training.loop import all_finite, step_seed
from reportgen.twins.setup import Setup


def lockstep_gradients(setup: Setup, seed: int, batch_size: int) -> int | None:
    """Gradient parity at every step of the budget run with ``seed``, at identical weights.

    The plain twin trains as its budget run does (same batches, generator seeds, the task's own step where it
    gives one, optimizer, skipped non-finite steps); before each step the recompute twin takes the plain twin's current
    parameters (its own buffers and module state carry on, as in its own run) and both compute
    gradients on the same batch. Rounding alone keeps these within the parity tolerances at every
    step; a fault that switches on at any step (a forward counter, a schedule, state updated
    twice) does not. Costs about two budget runs; asked only when trained parameters differ.

    Args:
        setup: the run's :class:`reportgen.twins.setup.Setup`.
        seed, batch_size: as for :meth:`reportgen.training.train.BudgetRuns.get`.

    Returns:
        None when every step's gradients agree within tolerance, else the first step (1-based)
        at which they do not.
    """
    from reportgen.results.distance import measure, tolerances

    budget: BudgetConfig = setup.config.budget
    rtol_atol, forward_seed = setup.tolerance(), setup.config.forward_seed
    plain, twin = setup.twin(False, optimizer=budget.optimizer), setup.twin(True, optimizer=budget.optimizer)
    plain_stream, twin_stream = dict(setup.task_rng), dict(setup.task_rng)
    pairs = list(zip(plain.trainable, twin.trainable))
    generator = torch.Generator().manual_seed(int(seed))
    if forward_seed is None:
        seed_all(int(seed))
    accepted = draws = steps = 0
    examples = int(budget.examples)
    while accepted < examples and draws < int(budget.max_steps_factor * math.ceil(examples / batch_size)):
        x, y = batch_to(
            setup.task.make_batch(generator, min(batch_size, examples - accepted)), setup.device, setup.dtype
        )
        step_rng = None if forward_seed is None else step_seed(forward_seed, int(seed), draws)
        draws += 1
        with torch.no_grad():
            for p, r in pairs:
                r.copy_(p)
        losses = []
        for each, stream in ((plain, plain_stream), (twin, twin_stream)):  # each its own task generators
            with drawn_from(setup.task, stream):
                losses.append(each.step((x, y), step_rng, accept=False, rng=False).loss)
        if not all_finite(losses[0], plain.trainable):  # the plain run skips this step too
            continue
        steps += 1
        for p, r in pairs:
            if (p.grad is None) != (r.grad is None) or (
                p.grad is not None
                and not measure(r.grad, p.grad, *tolerances(p.grad.dtype, *rtol_atol)).worst_excess <= 0
            ):
                return steps
        plain.apply()
        accepted += batch_size_of(x)
    return None
