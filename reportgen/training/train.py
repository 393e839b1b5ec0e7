"""Training to an equal accepted-example budget, and the rows of one training run (shared by the
task-metrics and larger-batch checks).

An *accepted* example is one whose update was applied. A step whose loss or any gradient is
not finite is skipped (gradients zeroed, no optimizer step) and its examples do not count, so
every run, whatever it skipped, has applied updates for exactly ``examples`` examples.

Same data order, same dropout masks for both twins: batches come from a ``torch.Generator``
seeded with the run's seed, and every random generator (:mod:`reportgen.rng`) is seeded before
every forward with a seed mixed from ``(forward_seed, seed, draw index)`` (identical for both twins).
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from torch import nn

from reportgen.progress import progress
from reportgen.results import FLAGGED, INFO, WARN, Role, Row
from reportgen.results.rounding import GradientNudge
from reportgen.rng import seed_all, seeded
from reportgen.structure import batch_size_of, call_model
from reportgen.tasks import batch_to
from reportgen.training import cache
from reportgen.trust.opened import opened_files
from reportgen.twins.recompute import plain_name
from reportgen.twins.setup import Setup

log = logging.getLogger("reportgen")

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
            trusted (digest mismatch, unreadable, refused by ``weights_only`` loading) and the
            run was trained afresh instead; None otherwise.
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
    model: nn.Module,
    task: Any,
    *,
    examples: int,
    batch_size: int,
    seed: int,
    forward_seed: int | None,
    optimizer: Any,
    device: torch.device,
    dtype: torch.dtype,
    eval_every: int,
    lr_scale: float = 1.0,
    max_steps: int | None = None,
    desc: str = "train",
    sharding: Sharding | None = None,
    nudge: Callable[[list[nn.Parameter]], None] | None = None,
) -> TrainResult:
    """Train ``model`` in place until ``examples`` examples have been accepted.

    Args:
        model: a fresh twin in train mode (modified in place).
        task: the task (``make_batch``, ``loss``, ``evaluate``, ``metric``).
        examples: accepted-example budget, examples.
        batch_size: examples per step; the last step draws only what the budget still needs.
        seed: seeds the data generator (data order) and, with ``forward_seed``, the dropout masks.
        forward_seed: ``cfg.forward_seed``; None = do not reseed per step (the global RNG is
            seeded once with ``seed`` at the start instead, so both twins still start alike).
        optimizer: ``_target_`` node called with ``params=`` (e.g. ``cfg.budget.optimizer``).
        device: where batches go. dtype: floating batches are cast to it.
        eval_every: accepted examples between learning-curve points (0 = start and end only).
        lr_scale: factor applied to every parameter group's learning rate (larger-batch rule).
        max_steps: cap on drawn batches (applied + skipped); default 4 × the steps the budget needs.
        desc: progress label (a bar on a terminal, periodic log lines otherwise: :mod:`reportgen.progress`).
        sharding: train one rank of a sharded twin (:class:`Sharding`): ``examples`` and
            ``batch_size`` are then global (summed over ranks), and every rank calls this together.
        nudge: called with the trainable parameters after every accepted backward, right before
            ``optimizer.step()`` (the rounding twin's gradient noise, :mod:`reportgen.results.rounding`).

    Returns:
        :class:`TrainResult`; ``complete`` is False when the cap stopped the run early.

    Raises:
        ValueError: under ``sharding``, a global batch that does not split equally over the ranks.
    """
    start = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = instantiate(optimizer, params=params)
    for group in opt.param_groups:
        group["lr"] = group["lr"] * lr_scale
    needed = math.ceil(examples / batch_size)
    max_steps = max_steps if max_steps is not None else 4 * needed
    generator = torch.Generator().manual_seed(seed)
    if forward_seed is None:
        seed_all(seed)
    accepted = steps = skipped = skipped_examples = draws = 0
    curve = [(0, evaluate(model, task)[task.metric])]
    next_eval = eval_every if eval_every > 0 else examples
    bar = progress(desc, total=examples, unit="ex")
    try:
        while accepted < examples and draws < max_steps:
            x, y = batch_to(task.make_batch(generator, min(batch_size, examples - accepted)), device, dtype)
            step_rng = None if forward_seed is None else step_seed(forward_seed, seed, draws)
            draws += 1
            opt.zero_grad(set_to_none=True)
            mine = (x, y) if sharding is None else sharding.share((x, y))
            with seeded(step_rng):
                loss = task.loss(call_model(model, mine[0]), mine[1])
                loss.backward()
            finite = all_finite(loss, params)
            if not (finite if sharding is None else sharding.agree(finite)):
                opt.zero_grad(set_to_none=True)
                skipped, skipped_examples = skipped + 1, skipped_examples + batch_size_of(x)
                bar.set_postfix(skipped=skipped)
                continue
            if nudge is not None:
                nudge(params)
            opt.step()
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


class BudgetRuns:
    """The run's cache of training runs to the accepted-example budget.

    The task-metrics check and the larger-batch experiment both need the plain twin trained at
    the base batch; this cache (one per run, held by :class:`reportgen.twins.setup.Setup` as
    ``budget_runs(setup)``) trains each ``(twin, seed, batch, budget, lr scale)`` once.
    """

    def __init__(self) -> None:
        self._runs: dict[tuple, TrainResult] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def get(
        self, setup: Setup, recompute: bool, seed: int, batch_size: int, lr_scale: float = 1.0, rounding: bool = False
    ) -> TrainResult:
        """A twin trained to ``cfg.budget.examples`` accepted examples (trained on first use).

        Args:
            setup: the run's :class:`reportgen.twins.setup.Setup`.
            recompute: train the recompute twin (else the plain one).
            seed: data-order and dropout seed of the run.
            batch_size: examples per step.
            lr_scale: learning-rate factor (1 = as configured).
            rounding: train the rounding twin (a plain twin whose gradients are nudged by the
                parity tolerance before every step, :mod:`reportgen.results.rounding`); cached on disk like
                the plain twin, under its own key.

        Returns:
            The :class:`TrainResult`.
        """
        budget = setup.cfg.budget
        key = (recompute, int(seed), int(batch_size), int(budget.examples), float(lr_scale), bool(rounding))
        if key not in self._runs:
            variant = "rounding" if rounding else "recompute" if recompute else "plain"
            nudge = GradientNudge(*setup.tolerance(), int(seed)) if rounding else None

            def train() -> TrainResult:
                log.info(
                    "training %s twin, seed %d: %d accepted examples at batch %d",
                    variant,
                    seed,
                    budget.examples,
                    batch_size,
                )
                return train_to_budget(
                    setup.build(recompute),
                    setup.task,
                    examples=int(budget.examples),
                    batch_size=int(batch_size),
                    seed=int(seed),
                    forward_seed=setup.cfg.forward_seed,
                    optimizer=budget.optimizer,
                    device=setup.device,
                    dtype=setup.dtype,
                    eval_every=int(budget.eval_every),
                    lr_scale=lr_scale,
                    max_steps=int(budget.max_steps_factor * math.ceil(budget.examples / batch_size)),
                    desc=f"{variant} seed {seed} batch {batch_size}",
                    nudge=nudge,
                )

            self._runs[key] = (
                train() if recompute else cached_plain_run(setup, int(seed), int(batch_size), lr_scale, train, variant)
            )
        return self._runs[key]


def lockstep_gradients(setup: Setup, seed: int, batch_size: int) -> int | None:
    """Gradient parity at every step of the budget run with ``seed``, at identical weights.

    The plain twin trains as its budget run does (same batches, generator seeds, optimizer,
    skipped non-finite steps); before each step the recompute twin takes the plain twin's current
    parameters (its own buffers and module state carry on, as in its own run) and both compute
    gradients on the same batch. Rounding alone keeps these within the parity tolerances at every
    step; a fault that switches on at any step (a forward counter, a schedule, state updated
    twice) does not. Costs about two budget runs; asked only when trained parameters differ.

    Args:
        setup: the run's :class:`reportgen.twins.setup.Setup`.
        seed, batch_size: as for :meth:`BudgetRuns.get`.

    Returns:
        None when every step's gradients agree within tolerance, else the first step (1-based)
        at which they do not.
    """
    from reportgen.results.distance import measure, tolerances

    budget, rtol_atol = setup.cfg.budget, setup.tolerance()
    plain, twin = setup.build(False), setup.build(True)
    pairs = list(
        zip([p for p in plain.parameters() if p.requires_grad], [p for p in twin.parameters() if p.requires_grad])
    )
    opt = instantiate(budget.optimizer, params=[p for p, _ in pairs])
    generator = torch.Generator().manual_seed(int(seed))
    if setup.cfg.forward_seed is None:
        seed_all(int(seed))
    accepted = draws = steps = 0
    examples = int(budget.examples)
    while accepted < examples and draws < int(budget.max_steps_factor * math.ceil(examples / batch_size)):
        x, y = batch_to(
            setup.task.make_batch(generator, min(batch_size, examples - accepted)), setup.device, setup.dtype
        )
        step_rng = None if setup.cfg.forward_seed is None else step_seed(setup.cfg.forward_seed, int(seed), draws)
        draws += 1
        with torch.no_grad():
            for p, r in pairs:
                r.copy_(p)
        losses = []
        for model in (plain, twin):
            model.zero_grad(set_to_none=True)
            with seeded(step_rng):
                losses.append(setup.task.loss(call_model(model, x), y))
                losses[-1].backward()
        if not all_finite(losses[0], [p for p, _ in pairs]):  # the plain run skips this step too
            continue
        steps += 1
        for p, r in pairs:
            if (p.grad is None) != (r.grad is None):
                return steps
            if (
                p.grad is not None
                and not measure(r.grad, p.grad, *tolerances(p.grad.dtype, *rtol_atol)).worst_excess <= 0
            ):
                return steps
        opt.step()
        accepted += batch_size_of(x)
    return None


def cached_plain_run(
    setup: Setup, seed: int, batch_size: int, lr_scale: float, train, twin: str = "plain"
) -> TrainResult:
    """The plain twin's budget run, shared across a sweep's jobs through :mod:`reportgen.training.cache`
    (``twin="rounding"``: the rounding twin's, under its own key).

    A trusted entry under the run's key is a hit (logged ``from cache`` with the key; the
    result carries ``cache_key``). A missing or stale entry is trained by ``train()`` and
    stored (complete runs only). An entry that exists but fails a check is never used: the run
    is trained afresh, carries ``cache_rejected`` (a WARN row in the report) and replaces it.
    A cache folder that cannot be written is logged and the run goes on.

    Args:
        setup: the run's :class:`reportgen.twins.setup.Setup` (config, device, dtype).
        seed, batch_size, lr_scale: as for :meth:`BudgetRuns.get`.
        train: trains the plain twin and returns its :class:`TrainResult`.

    Returns:
        The result, loaded or trained.
    """
    folder = cache.cache_dir(setup.cfg)
    if folder is None:
        return train()
    try:
        key, material = cache.plain_run_key(setup.cfg, setup.device, setup.dtype, seed, batch_size, lr_scale, twin=twin)
        secret = cache.cache_secret()
    except Exception as exc:  # noqa: BLE001 - no key or no secret, no reuse: trained as without a cache
        log.warning(
            "%s twin, seed %d, batch %d: training without the cache: no cache key or no cache secret "
            "(%s: %s; the secret is %s, see docs/sweeps.md)",
            twin,
            seed,
            batch_size,
            type(exc).__name__,
            exc,
            cache.secret_path(),
        )
        return train()
    rejected = None
    try:
        entry = cache.load(folder, key, secret)
    except cache.Rejected as exc:
        log.warning(
            "%s twin, seed %d, batch %d: cache entry sha256:%s in %s not used: %s; training instead",
            twin,
            seed,
            batch_size,
            key,
            folder,
            exc,
        )
        entry, rejected = None, (key, str(exc))
    if entry is not None:
        record, tensors = entry
        log.info("%s twin, seed %d, batch %d: from cache (key sha256:%s in %s)", twin, seed, batch_size, key, folder)
        result = TrainResult(
            **{**record, "curve": [(int(n), float(v)) for n, v in record["curve"]]}, final_params=tensors
        )
        result.cache_key = key
        return result
    with opened_files(ignore=(folder,)) as opened:  # data the model or task read while training
        result = train()
    result.cache_rejected = rejected
    if result.complete:
        record = {name: getattr(result, name) for name in cache.RECORD_FIELDS}
        try:
            cache.store(folder, key, material, record, result.final_params, secret, opened=opened)
        except OSError as exc:
            log.warning("could not write the %s-twin cache entry into %s: %s", twin, folder, exc)
    return result


def run_rows(
    check: str, variant: str, item: str, seed: int, result: TrainResult, metric: str, status: str = INFO
) -> list[Row]:
    """Rows of one training run: every held-out metric, accepted examples, skipped steps, and
    learning-curve points (metric ``curve_<metric>``, column ``accepted_examples``).

    Args:
        check: check name for the ``check`` column.
        variant: ``plain``, ``recompute`` or ``larger_batch``.
        item: e.g. ``"seed 0"``.
        seed: the run's seed (``seed`` column).
        result: the finished run.
        metric: the task's primary metric name (e.g. ``accuracy``).
        status: status of every row (INFO here; FLAGGED in the larger-batch experiment).

    Returns:
        Rows; the primary metric's row carries ``steps``, ``skipped_steps``, ``lr`` columns. A plain
        run trained because its cache entry was rejected adds a ``cache_entry_rejected`` row
        (``Role.CACHE``; WARN, or FLAGGED inside the flagged experiment).
    """
    common = {"seed": seed, "batch_size": result.batch_size}
    run = {
        **common,
        "accepted_examples": result.accepted_examples,
        "steps": result.steps,
        "skipped_steps": result.skipped_steps,
        "lr": result.lr,
    }
    cached = f"; from the plain-twin cache (key sha256:{result.cache_key})" if result.cache_key else ""
    rows = [
        Row(
            check=check,
            item=item,
            variant=variant,
            metric=metric,
            value=result.metrics[metric],
            threshold="",
            comparator="",
            status=status,
            detail=f"{result.accepted_examples} accepted examples in {result.steps} steps of batch {result.batch_size}, "
            f"lr {result.lr:g}{cached}",
            seconds=result.seconds,
            extra={**run, **({"cache_key": result.cache_key} if result.cache_key else {})},
            role=Role.RUN,
        )
    ]
    if result.cache_rejected:
        rejected_key, why = result.cache_rejected
        rows.append(
            Row(
                check=check,
                item=item,
                variant=variant,
                metric="cache_entry_rejected",
                value=math.nan,
                threshold="",
                comparator="",
                status=FLAGGED if status == FLAGGED else WARN,  # every row of a flagged experiment is FLAGGED
                detail=f"the plain-twin cache entry under this run's key (sha256:{rejected_key[:16]}…) was not used: "
                f"{why}; the plain twin was trained afresh in this run and the entry replaced",
                extra={**common, "cache_key": rejected_key, "cache_problem": why},
                role=Role.CACHE,
            )
        )
    rows += [
        Row(
            check=check,
            item=item,
            variant=variant,
            metric=name,
            value=value,
            threshold="",
            comparator="",
            status=status,
            detail="held-out, same data as the task metric",
            extra=dict(common),
            role=Role.HELD_OUT,
        )
        for name, value in sorted(result.metrics.items())
        if name != metric
    ]
    skip_detail = (
        (
            f"{result.skipped_steps} steps ({result.skipped_examples} examples) skipped for a non-finite loss "
            "or gradient; their examples are not accepted"
        )
        if result.skipped_steps
        else "no step skipped"
    )
    rows.append(
        Row(
            check=check,
            item=item,
            variant=variant,
            metric="accepted_examples",
            value=result.accepted_examples,
            threshold="",
            comparator="",
            status=status,
            detail=f"examples whose update was applied; {result.steps} applied steps",
            extra=dict(common),
            role=Role.ACCEPTED,
            unit="examples",
        )
    )
    rows.append(
        Row(
            check=check,
            item=item,
            variant=variant,
            metric="skipped_steps",
            value=result.skipped_steps,
            threshold="",
            comparator="",
            status=status,
            detail=skip_detail,
            extra={**common, "skipped_examples": result.skipped_examples},
            role=Role.SKIPPED,
            unit="steps",
        )
    )
    rows += [
        Row(
            check=check,
            item=item,
            variant=variant,
            metric=f"curve_{metric}",
            value=value,
            threshold="",
            comparator="",
            status=status,
            detail="learning-curve point",
            extra={**common, "accepted_examples": n},
            role=Role.CURVE,
        )
        for n, value in result.curve
    ]
    return rows


_RUNS: dict[int, BudgetRuns] = {}


def budget_runs(setup: Setup) -> BudgetRuns:
    """The run's cache of budget training runs: one :class:`BudgetRuns` per :class:`Setup`.

    Kept here rather than on the setup, so the twins do not depend on training; the entry is
    dropped when the setup is garbage-collected.
    """
    key = id(setup)
    if key not in _RUNS:
        _RUNS[key] = BudgetRuns()
        weakref.finalize(setup, _RUNS.pop, key, None)
    return _RUNS[key]
