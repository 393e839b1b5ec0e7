"""One twin's training trajectory, step by step, and several twins stepped in lockstep: what trajectory parity
and the later-step detector control both train with (checks never import each other)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from reportgen.config import ParityConfig
from reportgen.progress import progress
from reportgen.results.rounding import GradientNudge
from reportgen.rng import drawn_from
from reportgen.tasks import Batch, batch_to
from reportgen.training.loop import step_seed
from reportgen.twins.setup import Setup
from reportgen.twins.snapshot import Snapshot
from reportgen.twins.twin import Twin


def trajectory(
    setup: Setup,
    recompute: bool,
    nudge: GradientNudge | None = None,
    keep_grads: bool = False,
    twin: Twin | None = None,
    share: Callable[[Batch], Batch] | None = None,
    snapshot: Callable[[Twin], Snapshot] | None = None,
    digest_grads: bool = False,
) -> Iterator[Snapshot]:
    """Train a fresh twin for ``parity.steps`` steps on the training stream, yielding a view of its
    state after each step (:func:`reportgen.twins.snapshot.take` with ``clone=False``: valid until
    the next step). ``keep_grads``: the view carries clones of the gradients backward left (before
    any nudge), for the rounding envelope's gate; otherwise the gradients are freed after the step.

    Batches: ``task.make_batch`` with a generator seeded by ``cfg.seed``, ``parity.batch_size``
    examples each; before step ``k``'s forward every generator is seeded with
    ``step_seed(forward_seed, cfg.seed, k)`` (the same for every twin). ``nudge``: the rounding
    twin's gradient noise, applied before every step (before the task's ``before_step``). ``twin``: a twin
    already built to train instead of a fresh ``setup.twin(recompute)`` (the later-step control's faulty twin, a
    sharded twin). ``share``: this rank's part of each global batch (a sharded twin; every rank draws the same
    batches). ``snapshot``: what is yielded after each step (default :meth:`Twin.snapshot`, a view; a sharded twin's
    full state). ``digest_grads``: each step's gradients are hashed after backward (``twin.last.grad_digests``), to tell
    whether two twins' gradients differ at all without keeping a copy of either.
    """
    parity: ParityConfig = setup.config.parity
    seed, forward_seed = setup.config.seed, setup.config.forward_seed
    twin = setup.twin(recompute) if twin is None else twin
    generator = torch.Generator().manual_seed(seed)
    name = "rounding" if nudge is not None else "recompute" if recompute else "plain"
    stream = dict(setup.task_rng)  # this twin's copy of the task's own generators (twins step in turn)
    with progress(f"trajectory {name}", total=parity.steps, unit="step") as bar:
        for k in range(parity.steps):
            with drawn_from(setup.task, stream):
                batch = batch_to(setup.task.make_batch(generator, parity.batch_size), setup.device, setup.dtype)
                batch = batch if share is None else share(batch)
                step_rng = None if forward_seed is None else step_seed(forward_seed, seed, k)
                twin.step(batch, step_rng, nudge=nudge, keep_grads=keep_grads, digest_grads=digest_grads)
            if not keep_grads:
                twin.optimizer.zero_grad(set_to_none=True)  # the next step would: free them while the view is read
            bar.update(1)
            yield twin.snapshot() if snapshot is None else snapshot(twin)


#: ``{twin: its trajectory}`` of one lockstep run (:func:`lockstep`).
Twins = dict[str, Iterator[Snapshot]]


def lockstep(twins: Twins) -> Iterator[dict[str, Snapshot]]:
    """Step every trajectory of ``twins`` once per iteration and yield ``{twin: view}`` (each view valid
    until the next iteration): the twins are compared where they are, step by step, with no stored copy
    of any twin's state. A twin that raises ends the run with :class:`TwinRaised`."""
    iterators = dict(twins)
    while True:
        views = {}
        for name, steps in iterators.items():
            try:
                views[name] = next(steps)
            except StopIteration:
                return
            except Exception as exc:  # the caller turns it into the twin's ERROR row
                raise TwinRaised(name, exc) from exc
        yield views


class TwinRaised(Exception):
    """A twin's trajectory raised in :func:`lockstep`; ``twin`` names it, ``error`` is what it raised."""

    def __init__(self, twin: str, error: Exception):
        super().__init__(f"{twin}: {error}")
        self.twin, self.error = twin, error
