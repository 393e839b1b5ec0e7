"""A twin's whole training state after a step, and the rows that compare two of them.

Shared by the one-step parity check and the trajectory check: parameters, optimizer state,
buffers (BatchNorm running statistics, ``num_batches_tracked``), plain Python attributes of
modules (counters, flags), every global random generator's state after backward and the state of
every ``torch.Generator`` a module (or the task) holds after the step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from reportgen.config import STATE_PARITY, STEP_PARITY
from reportgen.results import Role, Row
from reportgen.results.compared import NO_AA, tensor_row, value_row
from reportgen.results.rounding import envelope
from reportgen.results.rows import with_rounding
from reportgen.rng import held
from reportgen.twins.recompute import named_inner_modules, plain_name

_SCALARS = (bool, int, float, str)
_SIZED = (list, tuple, dict, set)


@dataclass
class Snapshot:
    """A twin's state after one forward, backward and optimizer step.

    Attributes:
        params: ``{plain parameter name: tensor}``.
        optimizer_state: ``{"<param>.<state key>": tensor}`` (e.g. AdamW's ``exp_avg``).
        buffers: ``{plain buffer name: tensor}``.
        attributes: plain Python attributes of modules (:func:`module_attributes`).
        rng: every global generator's state right after backward (:func:`reportgen.rng.fingerprint`), and
            each generator a module or the task holds after the step (:func:`held_generators`).
        loss: the step's loss (detached, scalar).
        grads: ``{plain parameter name: gradient or None}`` after backward, before the step (and
            before any rounding nudge); empty when not taken.
    """

    params: dict[str, torch.Tensor]
    optimizer_state: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    attributes: dict[str, Any]
    rng: dict[str, torch.Tensor]
    loss: torch.Tensor | None = None
    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)


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


def held_generators(model: nn.Module, task: object = None) -> dict[str, torch.Tensor]:
    """``get_state()`` of every ``torch.Generator`` an attribute of a module of ``model`` (private names
    included; keyed ``<module path>.<attr>``) or of ``task`` (``task.<attr>``) holds."""
    found = {k: g for path, m in named_inner_modules(model) for k, g in held(m, path).items()}
    return {k: g.get_state() for k, g in (found | held(task, "task")).items()}


def take(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rng: dict[str, torch.Tensor],
    loss: torch.Tensor | None = None,
    grads: dict[str, torch.Tensor | None] | None = None,
    clone: bool = True,
    task: object = None,
) -> Snapshot:
    """Snapshot ``model`` and ``optimizer`` right after ``optimizer.step()`` (``grads``, taken by the
    caller before the step, kept as given), with the generators of ``model`` and ``task``
    (:func:`held_generators`) beside the global ``rng``.

    ``clone=False`` takes a view: the snapshot holds the twin's own tensors, no second copy of its
    training state. Use it when the twin is discarded (or compared) before it changes again."""
    keep = (lambda t: t.detach().clone()) if clone else (lambda t: t.detach())
    names = {p: plain_name(n) for n, p in model.named_parameters()}
    opt_state = {
        f"{names[p]}.{k}": keep(v if torch.is_tensor(v) else torch.tensor(v))
        for p, state in optimizer.state.items()
        for k, v in state.items()
    }
    return Snapshot(
        {names[p]: keep(p) for p in names},
        opt_state,
        {plain_name(n): keep(b) for n, b in model.named_buffers()},
        module_attributes(model),
        {k: v.clone() for k, v in rng.items()} | held_generators(model, task),
        None if loss is None else loss.detach().clone(),
        dict(grads or {}),
    )


def grads_of(model: nn.Module, clone: bool = True) -> dict[str, torch.Tensor | None]:
    """``{plain parameter name: gradient or None}`` of every trainable parameter (``clone=False``: the model's
    own ``.grad`` tensors, detached, no second copy)."""
    keep = (lambda g: g.detach().clone()) if clone else (lambda g: g.detach())
    return {
        plain_name(n): (keep(p.grad) if p.grad is not None else None)
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def grad_digests(model: nn.Module) -> dict[str, str | None]:
    """``{plain parameter name: SHA-256 of the gradient's bytes, or None}`` of every trainable parameter, one tensor
    at a time on the host (the peak is the largest gradient, never a copy of all). Equal digests are equal bytes;
    unlike a zero-tolerance comparison, ``-0.0`` and ``0.0`` differ and a NaN equals itself."""
    return {
        plain_name(n): (
            hashlib.sha256(p.grad.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()).hexdigest()
            if p.grad is not None
            else None
        )
        for n, p in model.named_parameters()
        if p.requires_grad
    }


#: Row roles whose floating tensors the rounding envelope applies to (RNG states and Python
#: attributes stay exact), with the item prefix :func:`snapshot_rows` gives them.
ENVELOPED: dict[str, tuple[str, str]] = {
    Role.PARAM: ("param ", "params"),
    Role.OPTIMIZER_STATE: ("optimizer ", "optimizer_state"),
    Role.BUFFER: ("buffer ", "buffers"),
}


def outside_tolerance(rows: list[Row]) -> bool:
    """True when some floating-state row (parameter, optimizer state, buffer) misses tolerance:
    the only case in which the rounding twin is worth building."""
    return any(r.role in ENVELOPED and not r.extra.get("excess", 0.0) <= 0 for r in rows)


def with_envelope(rows: list[Row], plain: Snapshot, rounding: Snapshot, factor: float) -> list[Row]:
    """Judge every parameter, optimizer-state and buffer row of ``rows`` (from
    :func:`snapshot_rows`) against the rounding envelope of its item (:mod:`reportgen.results.rounding`);
    other rows unchanged. Returns ``rows``."""
    envelopes = {role: envelope(getattr(plain, part), getattr(rounding, part)) for role, (_, part) in ENVELOPED.items()}
    for row in rows:
        if row.role in ENVELOPED:
            key = row.item.removeprefix(ENVELOPED[row.role][0])
            if key in envelopes[row.role]:
                with_rounding(row, envelopes[row.role][key], factor)
    return rows


#: The A/A columns a compared row carries (:func:`reportgen.results.compared.tensor_row`'s ``aa``).
AA_COLUMNS = ("aa_max_abs_err", "aa_excess", "aa_tolerance_used")


def aa_columns(plain: Snapshot, aa: Snapshot, rtol: float | None, atol: float | None) -> dict[str, dict[str, Any]]:
    """``{item: A/A columns}``: how far a second plain twin's snapshot is from the plain one, item by
    item, exactly as :func:`snapshot_rows` would fill them with ``aa`` given (same tolerances, a
    missing item is infinitely far). Lets the A/A twin be compared and discarded before the
    recompute twin is built, so two training states are resident at most."""
    return columns_of(snapshot_rows(plain, aa, None, rtol, atol))


def columns_of(rows: list[Row]) -> dict[str, dict[str, Any]]:
    """``{item: A/A columns}`` from :func:`snapshot_rows`'s rows of the plain twin against a second plain twin
    (no A/A twin given): what :func:`aa_columns` returns, for a caller that compared them its own way (a sharded
    check, one whole tensor at a time). Ignored attributes get none."""
    columns = {}
    for row in rows:
        if row.role == Role.IGNORED:
            continue
        if row.metric == "max_abs_err":
            used = row.extra.get("tolerance_used", 0.0 if row.extra["excess"] <= 0 else float("inf"))
            columns[row.item] = dict(zip(AA_COLUMNS, (row.value, row.extra["excess"], used)))
        else:
            columns[row.item] = {"aa_excess": row.extra["excess"]}
    return columns


def with_aa(rows: list[Row], columns: dict[str, dict[str, Any]]) -> list[Row]:
    """``rows`` of :func:`snapshot_rows` (no A/A twin) with the A/A columns of :func:`aa_columns`; an item
    neither twin of the A/A pair had is "None in both" (distance 0). Ignored attributes get none."""
    for row in rows:
        if row.role == Role.IGNORED:
            continue
        absent = dict.fromkeys(AA_COLUMNS if row.metric == "max_abs_err" else ("aa_excess",), 0.0)
        row.extra.update(columns.get(row.item, absent))
    return rows


def snapshot_rows(
    plain: Snapshot,
    recompute: Snapshot,
    aa: Snapshot | None,
    rtol: float | None,
    atol: float | None,
    ignore: Sequence[str] = (),
) -> list[Row]:
    """Rows comparing two snapshots (and the A/A twin's, when given) item by item.

    Module attributes whose ``<module path>.<attr>`` matches a glob in ``ignore``
    (``state.ignore_attributes``) are not compared: each gets an INFO row that shows both
    values and says it was ignored, so nothing is skipped silently.

    Returns:
        ``optimizer-step parity`` rows (each parameter, each optimizer-state tensor) and
        ``state parity`` rows (each buffer, each plain attribute, each generator state; a
        generator state is compared bitwise: any difference means later draws differ). A global
        generator's row says "after backward", a held one's (``blocks.0._gen``) "after the step".
    """
    out = []
    for (role, (prefix, part)), check in zip(ENVELOPED.items(), (STEP_PARITY, STEP_PARITY, STATE_PARITY)):
        mine, theirs, other = getattr(plain, part), getattr(recompute, part), getattr(aa, part, None)
        for k in sorted(set(mine) | set(theirs)):
            aa_k = NO_AA if other is None else other.get(k)
            out.append(tensor_row(check, f"{prefix}{k}", mine.get(k), theirs.get(k), rtol, atol, role, aa=aa_k))
    for key in sorted(set(plain.attributes) | set(recompute.attributes)):
        pattern = next((p for p in ignore if fnmatchcase(key.removeprefix("len(").removesuffix(")"), p)), None)
        if pattern is not None:
            said = f"ignored (state.ignore_attributes: {pattern!r}): plain={plain.attributes.get(key)!r}, "
            said += f"recompute={recompute.attributes.get(key)!r}"
            out.append(Row.fact(STATE_PARITY, f"attribute {key}", Role.IGNORED, said, metric="ignored"))
            continue
        out.append(
            value_row(
                STATE_PARITY,
                f"attribute {key}",
                plain.attributes.get(key),
                recompute.attributes.get(key),
                Role.ATTRIBUTE,
                aa=NO_AA if aa is None else aa.attributes.get(key),
            )
        )
    for key in plain.rng:
        out.append(
            tensor_row(
                STATE_PARITY,
                f"RNG {key} after {'backward' if key.endswith(')') else 'the step'}",
                plain.rng[key],
                recompute.rng.get(key),
                0.0,
                0.0,
                Role.RNG,
                aa=NO_AA if aa is None else aa.rng.get(key),
            )
        )
    return out
