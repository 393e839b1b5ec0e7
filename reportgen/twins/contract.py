"""The task contract (docs/own-model.md, "The task object"), probed on a small batch before any check runs:
``make_batch`` returns ``batch_size`` examples drawn only from its generator, the plain twin accepts the inputs,
``loss`` returns a scalar floating tensor. A breach stops the run with exit 2 and one paragraph naming the fix,
instead of an ERROR row in every check or parity measured on data that differs between the twins; a plain model
that raises whatever its inputs is left to the checks (the claim cannot be tested). The global RNG is restored.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._pytree import tree_leaves, tree_map

from reportgen.errors import SetupError

#: Examples in the probe batch: small, and above 1 so a batch dimension cannot hide.
PROBE_BATCH = 2
CONTRACT = (
    "the task contract (docs/own-model.md, 'The task object'): make_batch(generator, batch_size) -> (inputs, targets) "
    "with batch_size examples in the leading dimension, drawn only with `generator`; loss(output, target) "
    "-> a scalar floating tensor"
)


class TaskContractError(SetupError):
    """The task or model breaks the task contract (exit 2); the message names the fix."""


def _breach(what: str, fix: str) -> TaskContractError:
    return TaskContractError(f"{what}. {fix}. This is {CONTRACT}.")


def _draw(task: Any, seed: int, batch_size: int) -> tuple[Any, Any]:
    """One ``task.make_batch`` call with a fresh generator seeded ``seed``."""
    try:
        batch = task.make_batch(torch.Generator().manual_seed(seed), batch_size)
    except Exception as exc:  # user code
        raise _breach(
            f"task.make_batch(generator, {batch_size}) raised {type(exc).__name__}: {_first(exc)}",
            "Fix make_batch in your task",
        ) from exc
    if not isinstance(batch, (tuple, list)) or len(batch) != 2 or not all(_leaves(part) for part in batch):
        raise _breach(
            f"task.make_batch returned {_describe(batch)}, not (inputs, targets) tensors",
            "Return a tuple of two tensors (or of dicts/tuples of tensors)",
        )
    return batch[0], batch[1]


def _leaves(tree: Any) -> list[Tensor]:
    """The tensors in a batch part (a tensor, or a dict/tuple/list of them); [] if any leaf is not one."""
    leaves = tree_leaves(tree)
    return leaves if leaves and all(isinstance(t, Tensor) for t in leaves) else []


def check_task_contract(setup: Any) -> None:
    """Probe the task and the plain twin once on a small batch (module docstring).

    Args:
        setup: the run's :class:`reportgen.twins.setup.Setup` (task, config, ``build``).

    Raises:
        TaskContractError: the first breach found; the message names the contract and the fix.
    """
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        with torch.random.fork_rng(devices=[]):  # torch's CPU RNG is restored on exit
            _check(setup, setup.task)
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def _check(setup: Any, task: Any) -> None:
    seed = setup.config.seed
    inputs, targets = _draw(task, seed, PROBE_BATCH)
    for name, part in (("inputs", inputs), ("targets", targets)):
        for tensor in _leaves(part):
            if tensor.dim() == 0 or tensor.shape[0] != PROBE_BATCH:
                raise _breach(
                    f"task.make_batch(generator, {PROBE_BATCH}) returned {name} with a tensor of shape "
                    f"{list(tensor.shape)}, whose leading size is not the batch size {PROBE_BATCH}",
                    f"Return {name} with batch_size examples in the first dimension",
                )
    first, again = _leaves((inputs, targets)), _leaves(_draw(task, seed, PROBE_BATCH))
    if len(first) != len(again) or not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(first, again)):
        raise _breach(
            "task.make_batch ignores its generator: two calls with generators seeded alike returned "
            "different batches, so the plain and recompute twins would not see the same data",
            "Draw every random number from `generator` (torch.randn(..., generator=generator), "
            "torch.randperm(n, generator=generator)), never from the global RNG",
        )
    try:
        x, y = setup.make_batch(PROBE_BATCH, seed)  # moved to the run's device and dtype
    except Exception as exc:  # a batch reportgen cannot move
        raise _breach(
            f"reportgen cannot move the batch to {setup.device} / {setup.dtype}: {type(exc).__name__}: {_first(exc)}",
            "Return tensors as inputs and targets",
        ) from exc
    model = setup.build(False, compiled=False)  # the task contract, not torch.compile, is checked here
    try:
        output = model(x)
    except Exception as exc:  # user code
        if _floats_would_work(model, x, setup.dtype):
            raise _breach(
                f"the plain model raised {type(exc).__name__} on the integer inputs from make_batch "
                f"({_describe(x)}): {_first(exc)}; the same inputs as floating point run",
                "Return floating inputs for a model that needs them (reportgen casts floating inputs to "
                "the run's dtype and leaves integer ids, e.g. token ids for an embedding, as they are)",
            ) from exc
        return  # the plain run itself is broken: the checks report that the claim cannot be tested
    try:
        loss = task.loss(output, y)
    except Exception:  # noqa: BLE001 - user code; a plain run that fails is the checks' to report
        return
    if not isinstance(loss, Tensor) or loss.numel() != 1 or loss.dim() != 0 or not loss.is_floating_point():
        raise _breach(
            f"task.loss(output, target) returned {_describe(loss)}, not a scalar floating tensor",
            "Reduce the loss to one number, e.g. with .mean()",
        )
    if loss.requires_grad:
        try:
            loss.backward()
        except Exception:  # noqa: BLE001 - as for the forward: the checks report a broken plain run
            return


def _floats_would_work(model: torch.nn.Module, inputs: Any, dtype: torch.dtype) -> bool:
    """Whether a forward that failed on integer inputs runs with them cast to ``dtype``.

    Tells "integer inputs where the model needs floats" (a task-contract breach) from a plain
    model that is broken whatever its inputs (the claim cannot be tested; the checks say so).
    """
    leaves = tree_leaves(inputs)
    if not any(isinstance(t, Tensor) and not t.is_floating_point() and not t.is_complex() for t in leaves):
        return False
    cast = tree_map(lambda t: t.to(dtype) if isinstance(t, Tensor) and not t.is_floating_point() else t, inputs)
    try:
        with torch.no_grad():
            model(cast)
    except Exception:  # noqa: BLE001 - still failing: not a dtype problem
        return False
    return True


def _first(exc: BaseException) -> str:
    """The first line of an exception message."""
    return (str(exc).strip().splitlines() or [""])[0][:300]


def _describe(value: Any) -> str:
    """A short description of a returned value: a tensor's dtype and shape, else its type."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"a {type(value).__name__}"
