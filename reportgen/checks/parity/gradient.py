"""Fixed-input parity: loss, outputs, input gradient and every trainable parameter's gradient.

Twins from one state_dict, cloned inputs, one shared function
(:func:`reportgen.twins.forward.forward_backward`) — the pattern of torchtitan's
``test_activation_checkpoint.py``. A second plain twin, a fresh copy of the same build, runs the same
batch (the A/A control): every row shows how far it is from the plain twin beside the
recompute difference, and a plain twin that does not reproduce itself makes the claim
INCONCLUSIVE rather than blaming recomputation.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from reportgen.checks.base import Check, Section
from reportgen.checks.base.run import Run
from reportgen.config import GRADIENT_PARITY
from reportgen.results import Role, Row, Status
from reportgen.results.compared import NO_AA, tensor_row, zero_count_row
from reportgen.results.raised import raised_for_lack_of_grad, run_twin, tagged_input_grad
from reportgen.results.rows import aa_row, nonfinite_row, zero_gradients_row
from reportgen.structure import describe, has_floating
from reportgen.twins.forward import StepOutput, changes_said, forward_backward
from reportgen.twins.setup import Setup
from reportgen.twins.template import on_host


def _runs(setup: Setup, input_grad: bool):
    """Run plain, A/A and recompute twins one after another (what is kept of a finished twin waits on the host);
    return ``(plain, aa, recompute, error_rows, warnings the recompute twin raised)``."""
    ran: dict[str, StepOutput] = {}
    for name, recompute in (("plain", False), ("aa", False), ("recompute", True)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always" if recompute else "default")
            out, rows = run_twin(
                GRADIENT_PARITY,
                name if recompute else "plain",
                functools.partial(_fresh_run, setup, recompute, input_grad),
            )
        if rows and not recompute:
            return None, None, None, rows, []
        ran[name] = out if recompute else on_host(out)
    said = sorted({str(w.message).splitlines()[0] for w in caught})
    return ran["plain"], ran["aa"], ran["recompute"], rows, said


def _fresh_run(setup: Setup, recompute: bool, input_grad: bool) -> StepOutput:
    """The parity function on a fresh twin (its gradients are its own: the twin is dropped after)."""
    return forward_backward(setup.twin(recompute), setup.batch, setup.config.forward_seed, input_grad, False)


def gradient_parity(run: Run) -> list[Row]:
    """Compare loss, output, parameter gradients (training-like inputs) and the input gradient.

    The input gradient comes from a second set of runs whose floating input requires grad:
    that changes what the reentrant implementation records, so it is kept out of the
    training-like comparison.

    Returns:
        One row per tensor (metric ``max_abs_err``, judged ``allclose``; ``max_rel_err``,
        ``bitwise_equal``, both twins' values or norms, ``aa_max_abs_err``, ``aa_excess`` as
        extra columns), the A/A control row, the plain-twin-finite row, and INFO rows for
        warnings torch raised.
    """
    setup = run.setup
    rtol, atol = setup.tolerance()
    plain, aa, recompute, out, caught = _runs(setup, input_grad=False)
    out += [Row.fact(GRADIENT_PARITY, "torch warning", Role.WARNING, w) for w in caught]
    if plain is None:  # the plain run raised: nothing to compare against
        return out
    out.append(baseline_row(setup))
    out.append(nonfinite_row(GRADIENT_PARITY, {"loss": plain.loss, **{f"{n}.grad": g for n, g in plain.grads.items()}}))
    out.append(zero_gradients_row(GRADIENT_PARITY, plain.grads))
    if recompute is not None:
        out += compare(plain, recompute, rtol, atol, aa)
    own = not setup.training_step.sees_outputs  # the user's forwards: outputs and inputs are theirs
    if own or not has_floating(setup.batch[0]):
        said = (
            "not compared: the task's own forward_backward runs the forwards (only the loss and gradients are seen)"
            if own
            else f"no floating input ({describe(setup.batch[0])}): it has no gradient"
        )
        out.append(Row.fact(GRADIENT_PARITY, "input.grad", Role.INPUT_GRAD, said, metric="max_abs_err"))
        return out + [aa_row(GRADIENT_PARITY, out)]
    plain_g, aa_g, recompute_g, errors, _ = _runs(setup, input_grad=True)
    if errors:
        return out + errors + [aa_row(GRADIENT_PARITY, out)]
    if raised_for_lack_of_grad(out):  # e.g. reentrant with no input requiring grad: show what else differs
        out += [tagged_input_grad(r) for r in compare(plain_g, recompute_g, rtol, atol, aa_g)]
    out += _compare_maps(plain_g.input_grad, recompute_g.input_grad, aa_g.input_grad, Role.INPUT_GRAD, rtol, atol)
    return out + [aa_row(GRADIENT_PARITY, out)]


def baseline_row(setup: Setup) -> Row:
    """The plain twin must not recompute anything (observed in its backward): ``== 0`` modules,
    else INCONCLUSIVE (a factory that already turns recomputation on compares recompute with
    recompute)."""
    found = list(setup.baseline_recomputes)
    detail = (
        "the plain twin recomputes nothing in backward"
        if not found
        else f"the plain twin already recomputes ({', '.join(found[:4])}{' …' if len(found) > 4 else ''}): the "
        "baseline is not plain, so the claim cannot be judged. Build the model without recomputation"
    )
    return zero_count_row(
        GRADIENT_PARITY,
        "plain twin is plain",
        "recomputing_modules",
        len(found),
        "modules",
        Role.BASELINE,
        detail,
        on_miss=Status.INCONCLUSIVE,
        variant="plain",
        extra={"modules": ", ".join(found)},
    )


def _in_cache_of_one_twin(name: str, plain: StepOutput, recompute: StepOutput) -> str | None:
    """The cache path a tensor leaf lies in when only one twin returned that cache, else None."""
    for twin, other in ((plain, recompute), (recompute, plain)):
        for path, what in twin.others.items():
            if (
                what.startswith("cache ")
                and name.startswith(path + ".")
                and not other.others.get(path, "").startswith("cache ")
            ):
                return path
    return None


def _other_rows(plain: StepOutput, recompute: StepOutput) -> list[Row]:
    """One row per output leaf that is not a tensor, so every output is accounted for.

    Python scalars and strings are compared (``==``, FAIL when they differ); None, cache objects
    and unknown objects are stated as INFO, with what each twin returned. A cache that only the
    plain twin returns is stated, never a failure by itself: Hugging Face models turn
    ``use_cache`` off under gradient checkpointing.
    """
    rows = []
    for name in dict.fromkeys([*plain.others, *recompute.others]):
        p, r = plain.others.get(name, "absent"), recompute.others.get(name, "absent")
        scalars = all(x.split(" ", 1)[0] in ("bool", "int", "float", "str") for x in (p, r))
        said = f"plain returned {p}, recompute returned {r}"
        if scalars:
            equal = float(p == r)
            rows.append(
                Row.measured(
                    GRADIENT_PARITY,
                    name,
                    "equal",
                    equal,
                    "",
                    comparator="==",
                    threshold_value=1.0,
                    role=Role.OUTPUT_OTHER,
                    detail=said,
                )
            )
            continue
        said += (
            "; a cache present in one twin only is stated, not a failure (Hugging Face "
            "turns use_cache off under gradient checkpointing)"
            if "cache" in p + r and p != r
            else "; not a tensor, not compared"
            if p != r
            else "; not a tensor"
        )
        rows.append(Row.fact(GRADIENT_PARITY, name, Role.OUTPUT_OTHER, said, metric="not_compared"))
    return rows


def _changed_rows(plain: StepOutput, recompute: StepOutput) -> list[Row]:
    """One row when output leaves changed while the recompute twin's backward ran and not in the
    plain twin's (``== 0`` leaves, FAIL otherwise): the recomputation wrote the forward's outputs
    again, e.g. appended to a key/value cache. No row when neither twin's output changed."""
    extra_changes = {p: how for p, how in recompute.changed.items() if p not in plain.changed}
    if not extra_changes and not plain.changed:
        return []
    in_cache = any(p.startswith(c + ".") for c in recompute.caches for p in extra_changes)
    detail = (
        changes_said(extra_changes, recompute.caches, recompute.use_cache)
        if extra_changes
        else "the output changes during backward in the plain twin too (not caused by recompute)"
    )
    extra = {"in_cache": in_cache, "use_cache": recompute.use_cache, "leaves": ", ".join(extra_changes)}
    item, count = "output leaves changed during backward", len(extra_changes)
    row = zero_count_row(
        GRADIENT_PARITY, item, "changed_leaves", count, "leaves", Role.CHANGED_IN_BACKWARD, detail, extra=extra
    )
    return [row]


def _compare_maps(
    plain: Mapping[str, Any],
    recompute: Mapping[str, Any],
    aa: Mapping[str, Any] | None,
    role: str,
    rtol: float | None,
    atol: float | None,
    names: Iterable[str] | None = None,
    suffix: str = "",
) -> list[Row]:
    """One :func:`reportgen.results.compared.tensor_row` per tensor name: plain vs recompute, the A/A twin
    beside it. A name missing from one twin compares against None (a lost tensor is a row, never skipped).

    Args:
        plain, recompute, aa: ``{name: tensor or None}`` of each twin (outputs, retained or input gradients);
            ``aa`` None: no A/A twin (no A/A columns).
        role: the rows' :class:`reportgen.results.Role`.
        rtol, atol: the parity tolerance.
        names: the names to compare, in row order; default every name of either twin, sorted.
        suffix: appended to each name for the ``item`` column (``".grad"`` for parameter gradients).
    """
    names = sorted(set(plain) | set(recompute)) if names is None else names
    return [
        tensor_row(
            GRADIENT_PARITY,
            f"{name}{suffix}",
            plain.get(name),
            recompute.get(name),
            rtol,
            atol,
            role,
            aa=NO_AA if aa is None else aa.get(name),
        )
        for name in names
    ]


def compare(
    plain: StepOutput, other: StepOutput, rtol: float | None, atol: float | None, aa: StepOutput | None = None
) -> list[Row]:
    """Gradient parity's judge: ``other``'s run of the fixed batch against ``plain``'s, tensor by tensor (the loss,
    every output leaf, output leaves that are not tensors or changed during backward, retained gradients, every
    parameter gradient), each judged at ``rtol``/``atol`` (None: the tensor's dtype decides) with the A/A twin's
    distance beside it when ``aa`` is given. Callable by anyone who measured two runs (the detector controls, the
    sharded checks): measuring stays with the caller.

    Returns:
        ``gradient parity`` rows, in report order.
    """
    out = [tensor_row(GRADIENT_PARITY, "loss", plain.loss, other.loss, rtol, atol, Role.LOSS, aa=_aa_of(aa, "loss"))]
    leaves = [  # every tensor leaf, in output order; a cache object of one twin only has its row (_other_rows)
        name
        for name in dict.fromkeys([*plain.output, *other.output])
        if _in_cache_of_one_twin(name, plain, other) is None
    ]
    out += _compare_maps(plain.output, other.output, _aa_of(aa, "output"), Role.OUTPUT, rtol, atol, leaves)
    out += _other_rows(plain, other)
    out += _changed_rows(plain, other)
    out += _compare_maps(plain.retained, other.retained, _aa_of(aa, "retained"), Role.RETAINED_GRAD, rtol, atol)
    out += _compare_maps(plain.grads, other.grads, _aa_of(aa, "grads"), Role.PARAM_GRAD, rtol, atol, suffix=".grad")
    return out


def _aa_of(aa: StepOutput | None, part: str) -> Any:
    """``aa``'s ``part`` (``loss``, ``output``, ``retained``, ``grads``), or None for a map / ``NO_AA`` for the loss
    when there is no A/A twin."""
    if aa is None:
        return NO_AA if part == "loss" else None
    return getattr(aa, part)


CHECK = Check(
    gradient_parity,
    (
        Section(
            GRADIENT_PARITY,
            "One forward and backward on the same fixed batch, same weights and seeds. Worst tensors first; "
            "a second plain twin (A/A, a fresh copy of the same build) shows the noise floor beside each difference.",
            roles=(
                Role.LOSS,
                Role.OUTPUT,
                Role.OUTPUT_OTHER,
                Role.CHANGED_IN_BACKWARD,
                Role.RETAINED_GRAD,
                Role.PARAM_GRAD,
                Role.INPUT_GRAD,
                Role.AA,
                Role.BASELINE,
                Role.NONFINITE,
                Role.ZERO_GRADIENTS,
                Role.WARNING,
                Role.NOTE,
                Role.OBSERVED,
            ),
        ),
    ),
)
