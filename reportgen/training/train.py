"""The run's budget training runs: each ``(twin, seed, batch, budget, lr scale)`` trained once per
run (:class:`BudgetRuns`, held by the run: ``reportgen.checks.base.run.Run``), the plain twin's shared across a sweep's jobs
through the disk cache (:func:`cached_plain_run`). The loop, rows and lockstep parity live in their own
modules (:mod:`reportgen.training.loop`, :mod:`reportgen.training.rows`, :mod:`reportgen.training.lockstep`)."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from reportgen.config import BudgetConfig
from reportgen.results.rounding import GradientNudge
from reportgen.training import cache, cache_key, cache_secret
from reportgen.training.loop import TrainResult, train_to_budget
from reportgen.trust.opened import opened_files
from reportgen.twins.setup import Setup
from reportgen.twins.twin import Twin

log = logging.getLogger("reportgen")


class BudgetRuns:
    """The run's cache of training runs to the accepted-example budget.

    The task-metrics check and the larger-batch experiment both need the plain twin trained at
    the base batch; this cache (one per run, held by the run the pipeline hands to every check,
    ``reportgen.checks.base.run.Run``) trains each ``(twin, seed, batch, budget, lr scale)`` once.
    """

    def __init__(self) -> None:
        self._runs: dict[tuple, TrainResult] = {}

    def drop_weights(self) -> None:
        """Free every cached run's trained weights (``final_params``, a host copy of a whole model each) once they
        were compared: the runs' figures stay for the checks that read them again (the larger-batch experiment)."""
        for result in self._runs.values():
            result.final_params = {}

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
                parity tolerance before every step, :mod:`reportgen.results.rounding`); never from the disk cache.

        Returns:
            The :class:`TrainResult`.
        """
        budget: BudgetConfig = setup.config.budget
        key = (recompute, int(seed), int(batch_size), int(budget.examples), float(lr_scale), bool(rounding))
        if key not in self._runs:
            variant = "rounding" if rounding else "recompute" if recompute else "plain"
            nudge = GradientNudge(*setup.tolerance(), int(seed)) if rounding else None

            def train(**more: Any) -> TrainResult:
                log.info(
                    "training %s twin, seed %d: %d accepted examples at batch %d",
                    variant,
                    seed,
                    budget.examples,
                    batch_size,
                )
                desc = f"{variant} seed {seed} batch {batch_size}"
                twin = setup.twin(recompute, optimizer=budget.optimizer, lr_scale=lr_scale)
                return budget_run(setup, twin, budget, seed, batch_size, desc, nudge=nudge, **more)

            shared = not (recompute or rounding)  # only the plain twin's runs are shared on disk
            self._runs[key] = cached_plain_run(setup, seed, batch_size, lr_scale, train) if shared else train()
        return self._runs[key]


def budget_run(
    setup: Setup, twin: Twin, budget: Any, seed: int, batch_size: int, desc: str, **more: Any
) -> TrainResult:
    """:func:`train_to_budget` of ``twin`` on ``setup``'s task, device and dtype, to ``budget``'s examples (the
    ``budget`` config, or what a sharded run trains to) at ``batch_size``, with its evaluation interval and step
    cap (``max_steps_factor`` × the steps the examples need); ``more``: ``nudge``, ``sharding``, ``on_batch``."""
    examples, batch_size = int(budget.examples), int(batch_size)
    steps = int(budget.max_steps_factor * math.ceil(examples / batch_size))
    return train_to_budget(
        twin,
        setup.task,
        examples=examples,
        batch_size=batch_size,
        seed=int(seed),
        forward_seed=setup.config.forward_seed,
        device=setup.device,
        dtype=setup.dtype,
        eval_every=int(budget.eval_every),
        max_steps=steps,
        desc=desc,
        **more,
    )


def cached_plain_run(setup: Setup, seed: int, batch_size: int, lr_scale: float, train) -> TrainResult:
    """The plain twin's budget run, shared across a sweep's jobs through :mod:`reportgen.training.cache`.

    An entry is used only where it is keyed on the bytes it consumed: under the run's key, trusted (its HMAC),
    its stored first training step equal to this run's (:func:`reportgen.training.cache.fingerprint`), every
    training batch it drew equal to the one this run draws (data only, no model work), and its weights, evaluated
    once with this run's evaluation, giving the stored metrics, each bitwise. Then it is a hit (logged ``from
    cache`` with the key; the result carries ``cache_key``, ``cache_draws`` and ``cache_proof_seconds``). A missing
    or stale entry is trained by ``train()`` and stored with those proofs (complete runs whose first step, batches
    and evaluation, made again, are bitwise the same). An entry that exists but fails a check is never used: the
    run is trained afresh, carries ``cache_rejected`` (a WARN row naming the check: batch k, the evaluation) and
    replaces it. A cache folder that cannot be written is logged and the run goes on.

    Args:
        setup: the run's :class:`reportgen.twins.setup.Setup` (config, device, dtype).
        seed, batch_size, lr_scale: as for :meth:`BudgetRuns.get`.
        train: ``train(**more)`` trains the plain twin and returns its :class:`TrainResult` (``more``:
            ``on_batch``, passed to :func:`reportgen.training.loop.train_to_budget`).

    Returns:
        The result, loaded or trained.
    """
    folder = cache.cache_dir(setup.config.cache.enabled)
    if folder is None:
        return train()
    started = time.perf_counter()
    try:
        key, material = cache_key.plain_run_key(setup.config, setup.device, setup.dtype, seed, batch_size, lr_scale)
        secret = cache_secret.cache_secret()
        proof = cache.fingerprint(setup, seed, batch_size)
    except Exception as exc:  # noqa: BLE001 - no key, secret or fingerprint, no reuse: trained as without a cache
        log.warning(
            "plain twin, seed %d, batch %d: training without the cache: no cache key, cache secret or first "
            "step (%s: %s; the secret is %s, see docs/sweeps.md)",
            seed,
            batch_size,
            type(exc).__name__,
            exc,
            cache_secret.secret_path(),
        )
        return train()
    replay = cache.Replay(
        batches=lambda sizes: cache.draw_digests(setup, seed, sizes),
        evaluation=lambda tensors: cache.weights_evaluation(setup, tensors, seed),
    )
    rejected = None
    try:
        entry = cache.load(folder, key, secret, proof, replay)
    except cache.Rejected as exc:
        log.warning(
            "plain twin, seed %d, batch %d: cache entry sha256:%s in %s not used: %s; training instead",
            seed,
            batch_size,
            key,
            folder,
            exc,
        )
        entry, rejected = None, (key, str(exc))
    if entry is not None:
        record, tensors = entry
        drawn = record.pop("draws")
        seconds = time.perf_counter() - started
        log.info(
            "plain twin, seed %d, batch %d: from cache (key sha256:%s in %s), proven in %.2f s: first step, %d "
            "training batches drawn and hashed, one evaluation of its weights",
            seed,
            batch_size,
            key,
            folder,
            seconds,
            drawn,
        )
        result = TrainResult(
            **{**record, "curve": [(int(n), float(v)) for n, v in record["curve"]]}, final_params=tensors
        )
        result.cache_key, result.cache_draws, result.cache_proof_seconds = key, drawn, seconds
        return result
    draws: list[list] = []
    with opened_files(ignore=(folder,)) as opened:  # data the model or task read while training
        result = train(on_batch=cache.recorder(draws))
    result.cache_rejected = rejected
    if result.complete:
        _store(setup, seed, batch_size, result, draws, proof, opened, (folder, key, material, secret))
    return result


def _store(
    setup: Setup, seed: int, batch_size: int, result: TrainResult, draws: list, proof: dict, opened: list, where: tuple
) -> None:
    """Store a complete plain run (:func:`reportgen.training.cache.store`) when a later job could prove it: its
    first step, its training batches (drawn again) and the evaluation of its weights (done twice) are each
    bitwise reproducible; else log why not. ``where``: ``(folder, key, material, secret)``."""
    folder, key, material, secret = where
    what = f"plain twin, seed {seed}, batch {batch_size}: not cached"
    try:
        if cache.fingerprint(setup, seed, batch_size) != proof:  # no later job could match it
            log.warning("%s: its first step is not bitwise reproducible", what)
            return
        if cache.draw_digests(setup, seed, [n for n, _ in draws]) != [d for _, d in draws]:
            log.warning("%s: its training batches are not drawn again bitwise by the task alone", what)
            return
        evaluation = cache.weights_evaluation(setup, result.final_params, seed)
        if cache.weights_evaluation(setup, result.final_params, seed) != evaluation:
            log.warning("%s: the evaluation of its weights is not bitwise reproducible", what)
            return
    except Exception as exc:  # noqa: BLE001 - what cannot be proven later is not stored; the run goes on
        log.warning("%s: proving it raised %s: %s", what, type(exc).__name__, exc)
        return
    record = {name: getattr(result, name) for name in cache.RECORD_FIELDS}
    try:
        cache.store(
            folder,
            key,
            material,
            record,
            result.final_params,
            secret,
            proof,
            opened=opened,
            draws=draws,
            evaluation=evaluation,
        )
    except OSError as exc:
        log.warning("could not write the plain-twin cache entry into %s: %s", folder, exc)
