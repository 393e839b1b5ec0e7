"""One-optimizer-step parity (parameters, optimizer state) and state parity (buffers, plain
Python attributes of modules, global RNG state after backward)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from ..config import STATE_PARITY, STEP_PARITY
from ..recompute import named_inner_modules, plain_name
from ..results import Role, Row
from ..rows import raised_for_lack_of_grad, run_twin, tagged_input_grad, tensor_row, value_row
from ..setup import Setup, forward_backward
from . import Check, Section

_SCALARS = (bool, int, float, str)
_SIZED = (list, tuple, dict, set)


@dataclass
class AfterStep:
    """A twin's state after one forward, backward and optimizer step."""

    params: dict[str, torch.Tensor]
    optimizer_state: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    attributes: dict[str, Any]
    rng: dict[str, torch.Tensor]


def module_attributes(model: nn.Module) -> dict[str, Any]:
    """Plain Python attributes of every module: numbers, bools and strings as they are,
    lists/tuples/dicts/sets as ``len(...)``. Keys ``<module path>.<attr>``; private names skipped."""
    out: dict[str, Any] = {}
    for path, module in named_inner_modules(model):
        for key, value in vars(module).items():
            if key.startswith("_"):
                continue
            name = f"{path}.{key}" if path else key
            if isinstance(value, _SCALARS):
                out[name] = value
            elif isinstance(value, _SIZED):
                out[f"len({name})"] = len(value)
    return out


def rng_state() -> dict[str, torch.Tensor]:
    """Global RNG states: ``torch.get_rng_state()`` and, on CUDA, each device's state."""
    states = {"torch.get_rng_state()": torch.get_rng_state()}
    if torch.cuda.is_available():
        states.update({f"torch.cuda.get_rng_state({i})": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return states


def one_step(model: nn.Module, setup: Setup, input_grad: bool = False) -> AfterStep:
    """Forward, backward, read the RNG, one step of ``cfg.parity.optimizer``; snapshot everything."""
    names = {p: plain_name(n) for n, p in model.named_parameters()}
    optimizer = instantiate(setup.cfg.parity.optimizer, params=[p for p in model.parameters() if p.requires_grad])
    forward_backward(model, setup.batch, setup.task.loss, setup.cfg.forward_seed, input_grad)
    rng = {k: v.clone() for k, v in rng_state().items()}
    optimizer.step()
    opt_state = {f"{names[p]}.{k}": (v if torch.is_tensor(v) else torch.tensor(v)).detach().clone()
                 for p, state in optimizer.state.items() for k, v in state.items()}
    return AfterStep({names[p]: p.detach().clone() for p in names},
                     opt_state,
                     {plain_name(n): b.detach().clone() for n, b in model.named_buffers()},
                     module_attributes(model), rng)


def _tensor_rows(check: str, prefix: str, plain: dict, recompute: dict, setup: Setup, role: str) -> list[Row]:
    rtol, atol = setup.cfg.parity.rtol, setup.cfg.parity.atol
    return [tensor_row(check, f"{prefix}{k}", plain.get(k), recompute.get(k), rtol, atol, role)
            for k in sorted(set(plain) | set(recompute))]


def step_and_state_parity(setup: Setup) -> list[Row]:
    """Run one optimizer step on fresh twins; compare what the step and the forward changed.

    Returns:
        ``optimizer-step parity`` rows (each parameter, each optimizer-state tensor) and
        ``state parity`` rows (each buffer, each plain attribute, each RNG state; an RNG state
        is compared bitwise: any difference means later random draws differ).
    """
    rows = _compare_step(setup, input_grad=False)
    if raised_for_lack_of_grad(rows) and setup.batch[0].is_floating_point():
        rows += [tagged_input_grad(r) for r in _compare_step(setup, input_grad=True)]
    return rows


def _compare_step(setup: Setup, input_grad: bool) -> list[Row]:
    plain_model, recompute_model = setup.twins()
    plain, rows = run_twin(STEP_PARITY, "plain", lambda: one_step(plain_model, setup, input_grad))
    if rows:
        return rows
    recompute, rows = run_twin(STEP_PARITY, "recompute", lambda: one_step(recompute_model, setup, input_grad))
    if rows:
        return rows
    out = _tensor_rows(STEP_PARITY, "param ", plain.params, recompute.params, setup, Role.PARAM)
    out += _tensor_rows(STEP_PARITY, "optimizer ", plain.optimizer_state, recompute.optimizer_state, setup,
                        Role.OPTIMIZER_STATE)
    out += _tensor_rows(STATE_PARITY, "buffer ", plain.buffers, recompute.buffers, setup, Role.BUFFER)
    for key in sorted(set(plain.attributes) | set(recompute.attributes)):
        out.append(value_row(STATE_PARITY, f"attribute {key}", plain.attributes.get(key), recompute.attributes.get(key),
                             Role.ATTRIBUTE))
    for key in plain.rng:
        out.append(tensor_row(STATE_PARITY, f"RNG {key} after backward", plain.rng[key], recompute.rng.get(key), 0.0, 0.0,
                              Role.RNG))
    return out


CHECK = Check(step_and_state_parity, (
    Section(STEP_PARITY, "One step of the configured optimizer on each twin: parameters and optimizer state after it."),
    Section(STATE_PARITY, "Buffers, plain Python attributes of modules, and the global RNG state after backward."),
))
