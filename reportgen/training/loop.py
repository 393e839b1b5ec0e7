"""Training to an equal accepted-example budget: the loop every budget run uses (one process or
one rank of a sharded twin).

An *accepted* example is one whose update was applied. A step whose loss or any gradient is
not finite is skipped (gradients zeroed, no optimizer step) and its examples do not count, so
every run, whatever it skipped, has applied updates for exactly ``examples`` examples.

Same data order, same dropout masks for both twins: batches come from a ``torch.Generator``
seeded with the run's seed, and every random generator (:mod:`reportgen.rng`) is seeded before
every forward with a seed mixed from ``(forward_seed, seed, draw index)`` (identical for both twins).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from reportgen.progress import progress
from reportgen.rng import seed_all
from reportgen.structure import batch_size_of
from reportgen.tasks import batch_to
from reportgen.twins.recompute import plain_name
from reportgen.twins.twin import Twin

#: Learning-rate scaling rules for a larger batch (``larger_batch.lr_scaling``): factor of
#: ``new / base`` batch size. "linear": Goyal et al. 2017 ("Accurate, Large Minibatch SGD");
#: "sqrt": Krizhevsky 2014 ("One weird trick"), Hoffer et al. 2017.
LR_SCALING = {"none": lambda ratio: 1.0, "linear": lambda ratio: ratio, "sqrt": math.sqrt}


@dataclass
class TrainResult:
    """One training run to an accepted-example budget.

    Attributes:
        metrics: ``task.evaluate`` on held-out data after training (includes the task metric).
        accepted_examples: examples whose update was applied (== the budget when complete).
        steps: applied optimizer steps.
        skipped_steps: steps skipped for a non-finite loss or gradient.
        skipped_examples: examples in those skipped steps (not accepted).
        curve: ``[(accepted examples, task metric)]``, from 0 accepted to the end.
        lr: learning rate used (first parameter group), after any scaling rule.
        batch_size: examples per step (the last step may hold fewer, to land on the budget).
        seconds: wall time of the run, s (evaluation included).
        complete: False when the step cap stopped the run before the budget.
        final_params: ``{plain parameter name: tensor}`` after training (CPU copies), to
            compare the trained twins themselves, not only their metric.
        cache_key: hex SHA-256 of the plain-twin cache entry this run was loaded from
            (:mod:`reportgen.training.cache`), None when it was trained in this run.
        cache_rejected: ``(key, why)`` when an entry under this run's key existed but was not
            trusted (digest mismatch, unreadable, refused by ``weights_only`` loading, a training batch or
            the evaluation not bitwise the stored one) and the run was trained afresh instead; None otherwise.
        cache_proof_seconds: wall time, s, this run spent proving a loaded entry (its first step redone, its
            training batches drawn and hashed, its weights evaluated once); 0 when not loaded.
        cache_draws: training batches drawn and hashed to prove a loaded entry; 0 when not loaded.
    """

    metrics: dict[str, float]
    accepted_examples: int
    steps: int
    skipped_steps: int
    skipped_examples: int
    curve: list[tuple[int, float]] = field(default_factory=list)
    lr: float = math.nan
    batch_size: int = 0
    seconds: float = 0.0
    complete: bool = True
    final_params: dict[str, torch.Tensor] = field(default_factory=dict)
    cache_key: str | None = None
    cache_rejected: tuple[str, str] | None = None
    cache_proof_seconds: float = 0.0
    cache_draws: int = 0


@dataclass(frozen=True)
class Sharding:
    """How one rank of a sharded twin takes part in a budget run (:func:`train_to_budget`).

    Every rank draws the same global batch (same generator, same seed) and trains on its own
    share of it; the budget counts *global* accepted examples: a step is applied on every rank or
    on none (``agree``), and its whole global batch counts.

    Attributes:
        share: ``share(global batch) -> this rank's part`` (e.g. :func:`reportgen.distributed.launch.shard_batch`).
        agree: ``agree(this rank's loss and gradients are finite) -> every rank's are`` (a collective).
        final_params: ``{plain name: full parameter}`` of the sharded twin (a collective under FSDP2).
        ranks: the world size, for the report.
    """

    share: Callable[[tuple], tuple]
    agree: Callable[[bool], bool]
    final_params: Callable[[nn.Module], dict[str, torch.Tensor]]
    ranks: int


def step_seed(forward_seed: int, seed: int, draw: int) -> int:
    """The seed of every generator before forward number ``draw`` of the run with data seed ``seed``.

    Mixed with numpy's ``SeedSequence`` (well-spread, no collisions between nearby tuples), so
    each step and each seed gets its own dropout masks, identical for both twins.

    Returns:
        A seed in ``[0, 2**63)``.
    """
    state = np.random.SeedSequence([int(forward_seed), int(seed), int(draw)]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def evaluate(model: nn.Module, task: Any) -> dict[str, float]:
    """``task.evaluate(model)`` in eval mode under ``torch.no_grad``; RNG state left as found.

    Returns:
        The task's held-out metrics, e.g. ``{"accuracy": 0.96, "loss": 0.12}``.
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    was_training = model.training
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        model.eval()
        try:
            return {k: float(v) for k, v in task.evaluate(model).items()}
        finally:
            model.train(was_training)


def all_finite(loss: torch.Tensor, params: list[nn.Parameter]) -> bool:
    """True when ``loss`` and every existing gradient of ``params`` are finite (one host sync).
    A sharded gradient (FSDP2's ``DTensor``) is read as this rank's shard: the ranks then agree
    (:class:`Sharding`)."""
    local = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in params if p.grad is not None]
    if local and all(g.device == loss.device and g.is_floating_point() and g.layout == torch.strided for g in local):
        # One fused kernel list: a tensor's norm is finite only when every element is (NaN and Inf
        # propagate). A finite tensor whose norm overflows falls through to the element-wise test.
        norms = torch._foreach_norm(local)
        if bool(torch.isfinite(torch.cat([loss.detach().float().reshape(-1), torch.stack(norms).float()])).all()):
            return True
    flags = [torch.isfinite(loss).all()] + [torch.isfinite(g).all() for g in local]
    return bool(torch.stack([f.to(loss.device) for f in flags]).all())


def train_to_budget(
    twin: Twin,
    task: Any,
    *,
    examples: int,
    batch_size: int,
    seed: int,
    forward_seed: int | None,
    device: torch.device,
    dtype: torch.dtype,
    eval_every: int,
    max_steps: int | None = None,
    desc: str = "train",
    sharding: Sharding | None = None,
    nudge: Callable[[list[nn.Parameter]], None] | None = None,
    on_batch: Callable[[int, Any], None] | None = None,
) -> TrainResult:
    """Train ``twin`` in place until ``examples`` examples have been accepted, one :meth:`Twin.step` per drawn batch.

    Args:
        twin: a fresh twin in train mode with its optimizer (learning rate already scaled) and the run's step
            (modified in place).
        task: the task (``make_batch``, ``evaluate``, ``metric``).
        examples: accepted-example budget, examples.
        batch_size: examples per step; the last step draws only what the budget still needs.
        seed: seeds the data generator (data order) and, with ``forward_seed``, the dropout masks.
        forward_seed: ``cfg.forward_seed``; None = do not reseed per step (the global RNG is
            seeded once with ``seed`` at the start instead, so both twins still start alike).
        device: where batches go. dtype: floating batches are cast to it.
        eval_every: accepted examples between learning-curve points (0 = start and end only).
        max_steps: cap on drawn batches (applied + skipped); default 4 × the steps the budget needs.
        desc: progress label (a bar on a terminal, periodic log lines otherwise: :mod:`reportgen.progress`).
        sharding: train one rank of a sharded twin (:class:`Sharding`): ``examples`` and
            ``batch_size`` are then global (summed over ranks), and every rank calls this together.
        nudge: called with the trainable parameters after every accepted backward, right before
            the task's ``before_step`` and ``optimizer.step()`` (the rounding twin's gradient noise,
            :mod:`reportgen.results.rounding`).
        on_batch: called with the examples asked for and each batch exactly as the task drew it (before it
            moves to ``device``), once per draw, skipped steps included (the plain-twin cache hashes what the
            run consumed, :func:`reportgen.training.cache.recorder`).

    Returns:
        :class:`TrainResult`; ``complete`` is False when the cap stopped the run early.

    Raises:
        ValueError: under ``sharding``, a global batch that does not split equally over the ranks.
    """
    start = time.perf_counter()
    model, opt = twin.model, twin.optimizer
    needed = math.ceil(examples / batch_size)
    max_steps = max_steps if max_steps is not None else 4 * needed
    generator = torch.Generator().manual_seed(seed)
    if forward_seed is None:
        seed_all(seed)
    accepted = steps = skipped = skipped_examples = draws = 0
    curve = [(0, evaluate(model, task)[task.metric])]
    next_eval = eval_every if eval_every > 0 else examples

    def finite(loss: torch.Tensor) -> bool:  # a non-finite step is skipped on every rank or on none
        ok = all_finite(loss, twin.trainable)
        return ok if sharding is None else sharding.agree(ok)

    bar = progress(desc, total=examples, unit="ex")
    try:
        while accepted < examples and draws < max_steps:
            wanted = min(batch_size, examples - accepted)
            drawn = task.make_batch(generator, wanted)
            if on_batch is not None:
                on_batch(wanted, drawn)
            x, y = batch_to(drawn, device, dtype)
            step_rng = None if forward_seed is None else step_seed(forward_seed, seed, draws)
            draws += 1
            mine = (x, y) if sharding is None else sharding.share((x, y))
            if not twin.step(mine, step_rng, accept=finite, nudge=nudge, rng=False).applied:
                opt.zero_grad(set_to_none=True)
                skipped, skipped_examples = skipped + 1, skipped_examples + batch_size_of(x)
                bar.set_postfix(skipped=skipped, refresh=False)  # shown at the next timed line, not one line each
                continue
            steps, accepted = steps + 1, accepted + batch_size_of(x)
            bar.update(batch_size_of(x))
            if accepted >= next_eval and accepted < examples:
                curve.append((accepted, evaluate(model, task)[task.metric]))
                while next_eval <= accepted:
                    next_eval += eval_every if eval_every > 0 else examples
    finally:
        bar.close()
    opt.zero_grad(set_to_none=True)
    metrics = evaluate(model, task)
    curve.append((accepted, metrics[task.metric]))
    final = (
        {plain_name(n): p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
        if sharding is None
        else {n: t.to("cpu") for n, t in sharding.final_params(model).items()}
    )
    return TrainResult(
        metrics,
        accepted,
        steps,
        skipped,
        skipped_examples,
        curve,
        float(opt.param_groups[0]["lr"]),
        batch_size,
        time.perf_counter() - start,
        complete=accepted >= examples,
        final_params=final,
    )
