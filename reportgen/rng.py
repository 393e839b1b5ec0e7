"""Every random generator a model may use, seeded identically before each forward of either twin.

"Same training" (docs/architecture.md) means the twins draw the same random numbers. Seeding
torch alone is not enough: a model that flips a Python ``random`` coin (LayerDrop) or draws
from NumPy would take different paths in the two twins, and every difference would then be
blamed on recomputation. :func:`seeded` seeds all of :data:`GENERATORS` and gives the caller
its own states back afterwards, so nothing outside the forward is disturbed.

``torch.utils.checkpoint``'s ``preserve_rng_state`` replays torch's CPU and CUDA generators
in the recomputed forward, not Python's or NumPy's: a recomputed region that draws from them
advances them twice, which :func:`fingerprint` makes visible in state parity. Nor does it replay a
``torch.Generator`` a module or the task holds (:func:`held`): state parity compares those too.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

#: The generators :func:`seeded` controls, in the words the report uses.
GENERATORS = (
    "torch CPU generator",
    "torch CUDA generator of every initialised device",
    "Python random",
    "NumPy global generator (numpy.random)",
)


def _cuda() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


@functools.cache
def _accelerator() -> bool:
    """True when torch sees an accelerator (CUDA, MPS, XPU, MTIA or a custom device) in this process."""
    return torch.accelerator.is_available()


def seed_all(seed: int) -> None:
    """Seed torch (CPU and every CUDA device), Python ``random`` and NumPy's global generator.

    Without an accelerator only the CPU generator is seeded: ``torch.manual_seed`` would also queue
    a lazy seed for CUDA, XPU and MTIA, recording a Python stack trace each time (about 1 ms per
    call, before every forward of a training run) for devices that cannot exist in this process.

    Args:
        seed: any integer; NumPy takes it modulo 2**32 (its seed range).
    """
    if _accelerator():
        torch.manual_seed(seed)  # also seeds every CUDA device (torch.manual_seed docs)
    else:
        torch.default_generator.manual_seed(int(seed))
    random.seed(seed)
    np.random.seed(seed % 2**32)


def capture() -> dict[str, Any]:
    """The current states of every generator in :data:`GENERATORS` (for :func:`restore`)."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if _cuda() else None,
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }


def restore(states: dict[str, Any]) -> None:
    """Put back states taken by :func:`capture`."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None:
        torch.cuda.set_rng_state_all(states["cuda"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])


@contextlib.contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Seed every generator with ``seed`` for the body, then restore the caller's states.

    Args:
        seed: the seed; None leaves every generator alone (``forward_seed: null``).
    """
    if seed is None:
        yield
        return
    states = capture()
    seed_all(seed)
    try:
        yield
    finally:
        restore(states)


def fingerprint() -> dict[str, torch.Tensor]:
    """Every generator's state as a tensor, to compare bitwise between the twins.

    Returns:
        ``{"torch.get_rng_state()": uint8 [5056], "torch.cuda.get_rng_state(i)": ...,
        "random.getstate()": int64 [625], "numpy.random.get_state()": int64 [625]}``; the
        Python and NumPy entries hold the Mersenne Twister key and its position.
    """
    states = {"torch.get_rng_state()": torch.get_rng_state()}
    if _cuda():
        states.update({f"torch.cuda.get_rng_state({i})": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    states["random.getstate()"] = torch.tensor(random.getstate()[1], dtype=torch.int64)
    numpy_state: Any = np.random.get_state(legacy=True)  # ("MT19937", keys, position, ...)
    keys, position = numpy_state[1], numpy_state[2]
    states["numpy.random.get_state()"] = torch.tensor([*np.asarray(keys).tolist(), int(position)], dtype=torch.int64)
    return states


def held(owner: object, path: str = "") -> dict[str, torch.Generator]:
    """Every ``torch.Generator`` an attribute of ``owner`` (a module, the task) holds, private names
    included, keyed ``<path>.<attr>`` (``<attr>`` when ``path`` is empty)."""
    found = getattr(owner, "__dict__", {}).items()
    return {f"{path}.{k}" if path else k: v for k, v in found if isinstance(v, torch.Generator)}


@contextlib.contextmanager
def drawn_from(owner: object, states: dict[str, torch.Tensor]) -> Iterator[None]:
    """Run the body with the generators :func:`held` by ``owner`` (the task's own) at ``states``, update ``states``
    in place to where the body leaves them, then put back what they were before: twins stepped in turn (a lockstep
    trajectory) each draw from their own copy of the task's stream. A generator ``states`` lacks starts as it is."""
    generators = held(owner)
    before = {name: g.get_state() for name, g in generators.items()}
    for name, g in generators.items():
        if name in states:
            g.set_state(states[name])
    try:
        yield
    finally:
        for name, g in generators.items():
            states[name] = g.get_state()
            g.set_state(before[name])
