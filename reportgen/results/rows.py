"""Row builders shared by the checks: compare a tensor or a value between the twins, turn an
exception into an ERROR row. Checks never import each other; what they share lives here."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

from torch import Tensor

from reportgen.results import BASELINE, BASELINE_TWINS, ERROR, INCONCLUSIVE, TWIN, Role, Row
from reportgen.results.distance import measure, nonfinite_count, tolerances

#: Marker for "the A/A twin was not run" (``aa`` arguments default to it).
NO_AA = object()


def _both_values(plain: Tensor, recompute: Tensor) -> dict[str, Any]:
    """Both twins' values for the report: the numbers of a scalar, else the L2 norms."""
    if plain.numel() == 1 and recompute.numel() == 1:
        return {"plain_value": float(plain.double()), "recompute_value": float(recompute.double())}
    if not plain.is_floating_point():  # e.g. a generator state: say how much of it differs
        differ = int((plain != recompute).sum())
        return {"plain_value": f"{plain.numel()} values", "recompute_value": f"{differ} of them differ"}
    norm = lambda t: float(t.detach().double().norm()) if t.is_floating_point() else float("nan")  # noqa: E731
    return {"plain_norm": norm(plain), "recompute_norm": norm(recompute)}


def _aa_extra(plain: Tensor | None, aa: Any, rt: float, at: float) -> dict[str, Any]:
    """A/A columns: how far a second, independent plain twin is from the plain twin."""
    if aa is NO_AA:
        return {}
    if plain is None or aa is None:
        same = plain is None and aa is None
        return {
            "aa_max_abs_err": 0.0 if same else float("inf"),
            "aa_excess": 0.0 if same else float("inf"),
            "aa_tolerance_used": 0.0 if same else float("inf"),
        }
    d = measure(aa, plain, rt, at)
    return {"aa_max_abs_err": d.max_abs_err, "aa_excess": d.worst_excess, "aa_tolerance_used": d.tolerance_used}


def tolerance_used(row: Row, prefix: str = "") -> float:
    """The share of its tolerance a compared item uses (``tolerance_used``, or ``aa_tolerance_used``
    with ``prefix="aa_"``); rows without that column (plain values, generator states) count 0 when
    within (``excess <= 0``) and inf when not."""
    used = row.extra.get(f"{prefix}tolerance_used")
    if used is not None and used == used:
        return float(used)
    return 0.0 if row.extra.get(f"{prefix}excess", 0.0) <= 0 else float("inf")


def tensor_row(
    check: str,
    item: str,
    plain: Tensor | None,
    recompute: Tensor | None,
    rtol: float | None,
    atol: float | None,
    role: str = "",
    aa: Any = NO_AA,
) -> Row:
    """Measure how far one tensor of the recompute run is from the plain run's.

    The row is judged by :func:`reportgen.results.judge` with comparator ``allclose`` on the
    ``excess`` column (``max(|a - b| - (atol + rtol |b|))``, <= 0 passes). NaN or Inf in either
    tensor is never equal (excess inf). ``None`` in one run and a tensor in the other has
    excess inf (a gradient that silently vanished); ``None`` in both has excess 0, with a note.

    Args:
        aa: the same tensor from a second, independent plain twin (A/A control); its distance
            from the plain tensor goes in ``aa_max_abs_err`` / ``aa_excess`` beside the row's.
    """
    if plain is None or recompute is None:
        present = plain if plain is not None else recompute
        rt, at = tolerances(present.dtype, rtol, atol) if present is not None else (0.0, 0.0)
        extra = _aa_extra(plain, aa, rt, at)
        if plain is None and recompute is None:
            return Row(
                check=check,
                item=item,
                variant="recompute",
                metric="max_abs_err",
                value=0.0,
                threshold="",
                comparator="allclose",
                detail="None in both runs",
                role=role,
                extra={"excess": 0.0, **extra},
            )
        missing = "recompute" if recompute is None else "plain"
        return Row(
            check=check,
            item=item,
            variant="recompute",
            metric="max_abs_err",
            value=float("inf"),
            threshold="",
            comparator="allclose",
            role=role,
            detail=f"None in the {missing} run, a tensor in the other: it would not train the same",
            extra={
                "excess": float("inf"),
                "plain_value": "None" if plain is None else "tensor",
                "recompute_value": "None" if recompute is None else "tensor",
                **extra,
            },
        )
    rt, at = tolerances(plain.dtype, rtol, atol)
    d = measure(recompute, plain, rt, at)
    if d.nonfinite_b:
        detail = f"{d.nonfinite_b} non-finite value(s) (NaN/Inf) in the plain run: never equal"
    elif d.nonfinite_a:
        detail = f"{d.nonfinite_a} non-finite value(s) (NaN/Inf) in the recompute run only"
    else:
        detail = (
            "bitwise equal"
            if d.bitwise_equal
            else f"within tolerance (uses {d.tolerance_used:.0%} of it){_near_zero(d)}"
            if d.worst_excess <= 0
            else f"exceeds tolerance by {d.worst_excess:.3g}"
            + (f" ({d.tolerance_used:.3g}× the tolerance)" if d.tolerance_used < float("inf") else "")
        )
    if recompute.shape != plain.shape:
        detail = f"shape {tuple(recompute.shape)} vs plain {tuple(plain.shape)}"
    return Row(
        check=check,
        item=item,
        variant="recompute",
        metric="max_abs_err",
        value=d.max_abs_err,
        threshold=f"atol={at:g} rtol={rt:g}",
        comparator="allclose",
        detail=detail,
        role=role,
        extra={
            "max_rel_err": d.max_rel_err,
            "tolerance_used": d.tolerance_used,
            "bitwise_equal": d.bitwise_equal,
            "atol": at,
            "rtol": rt,
            "excess": d.worst_excess,
            "nonfinite_plain": d.nonfinite_b,
            "nonfinite_recompute": d.nonfinite_a,
            **(_both_values(plain, recompute) if recompute.shape == plain.shape and not d.bitwise_equal else {}),
            **_aa_extra(plain, aa, rt, at),
        },
    )


def _near_zero(d) -> str:
    """A note for a passing tensor whose relative difference looks large: entries near zero,
    where ``atol`` decides, drive it (so the relative figure is not the deciding one)."""
    return (
        f"; its max relative difference {d.max_rel_err:.2g} comes from entries near zero, where atol decides"
        if d.max_rel_err > 0.01
        else ""
    )


#: The detail of a difference the rounding envelope accounts for (reportgen/rounding.py).
ROUNDING_LEVEL = "differs at rounding level, as any re-association would"

#: The report's sentence on the rounding envelope, for the sections that use it.
ROUNDING_NOTE = (
    "An item outside tolerance passes if within parity.rounding_factor × its rounding envelope (how far a "
    'plain twin moves when its gradients are nudged by the gradient tolerance; docs/verdict.md, "Rounding is not '
    'a fault"), for floating tensors and only while the recompute gradients are at rounding level.'
)


def effective_excess(row: Row) -> float:
    """How far past what passes ``row`` is: its tolerance ``excess``, or, when it carries a
    ``rounding_excess`` (difference minus the allowed multiple of its rounding envelope), the
    smaller of the two. <= 0 means the row passes; NaN counts as infinitely far."""
    excess = row.extra.get("excess", float("inf"))
    rounding = row.extra.get("rounding_excess")
    excess = float("inf") if excess != excess else excess
    return excess if rounding is None or rounding != rounding else min(excess, rounding)


def envelope_used(difference: float, envelope: float, factor: float) -> float:
    """How far inside its rounding allowance a difference is: ``difference / (factor × envelope)``
    (0.41 = uses 0.41 of what the envelope allows; <= 1 passes; inf for a zero envelope)."""
    allowed = factor * envelope
    return difference / allowed if allowed > 0 else (0.0 if difference == 0 else float("inf"))


def _uses(share: float, factor: float) -> str:
    """``uses 0.41 of its 2× rounding envelope`` (the margin a passing item has left)."""
    return f"uses {share:.2f} of its {factor:g}× rounding envelope"


def with_rounding(row: Row, envelope: float, factor: float) -> Row:
    """Add the rounding envelope to a tensor row (``max_abs_err``) and judge it again.

    Columns ``rounding_envelope`` (max abs difference of the rounding twin from plain for the
    same item), ``rounding_factor`` and ``rounding_excess = value - factor × envelope``; a row
    outside tolerance but with ``rounding_excess <= 0`` passes (:func:`reportgen.results.judge`)
    with a detail that says so. A row within tolerance keeps its detail.
    """
    rounding_excess = row.value - factor * envelope if row.value == row.value else float("inf")
    row.extra.update(rounding_envelope=envelope, rounding_factor=factor, rounding_excess=rounding_excess)
    if not row.extra.get("excess", 0.0) <= 0:
        row.detail = (
            f"{ROUNDING_LEVEL}: max abs {row.value:.3g} is within {factor:g}× the rounding envelope "
            f"{envelope:.3g} (the rounding twin; {_uses(envelope_used(row.value, envelope, factor), factor)})"
            if rounding_excess <= 0
            else f"{row.detail}; also outside {factor:g}× the rounding envelope {envelope:.3g}"
        )
    row.rejudge()
    return row


def value_row(check: str, item: str, plain: Any, recompute: Any, role: str = "", aa: Any = NO_AA) -> Row:
    """Compare a plain Python value (number, bool, string, length) between the twins: numbers
    by ``abs_diff == 0``, anything else by ``mismatch == 0`` (1 when they differ). ``aa`` is the
    value of a second plain twin (A/A control, column ``aa_excess``: 0 same, inf different)."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (plain, recompute))
    value = abs(float(recompute) - float(plain)) if numeric else float(plain != recompute)
    extra = {
        "plain_value": repr(plain),
        "recompute_value": repr(recompute),
        "excess": 0.0 if plain == recompute else float("inf"),
    }
    if aa is not NO_AA:
        extra["aa_excess"] = 0.0 if aa == plain else float("inf")
    return Row(
        check=check,
        item=item,
        variant="recompute",
        metric="abs_diff" if numeric else "mismatch",
        value=value,
        threshold="0",
        comparator="==",
        detail=f"plain={plain!r}, recompute={recompute!r}",
        role=role,
        threshold_value=0.0,
        extra=extra,
    )


def aa_row(check: str, rows: list[Row]) -> Row:
    """The plain-vs-plain (A/A) control of ``rows``: how many compared items a second,
    independent plain twin does not reproduce within the same tolerance.

    Judged ``== 0`` with ``on_miss`` INCONCLUSIVE: when the plain twin does not even reproduce
    itself, a difference under recompute cannot be blamed on recomputation.
    """
    measured = [r for r in rows if "aa_excess" in r.extra]
    moved = [r for r in measured if not r.extra["aa_excess"] <= 0]
    worst = max((r.extra.get("aa_max_abs_err", float("inf")) for r in moved), default=0.0)
    names = ", ".join(r.item for r in moved[:4]) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")
    detail = (
        f"a second, independently built plain twin reproduces all {len(measured)} items of the plain twin"
        if not moved
        else f"the plain twin is not reproducible against itself: {len(moved)} of {len(measured)} items moved between "
        f"two plain runs ({names}); largest A/A difference {worst:.3g}. The claim cannot be judged"
    )
    return Row(
        check=check,
        item="plain vs plain (A/A control)",
        variant="aa",
        metric="aa_items_outside_tolerance",
        value=float(len(moved)),
        threshold="0",
        comparator="==",
        detail=detail,
        role=Role.AA,
        unit="items",
        threshold_value=0.0,
        on_miss=INCONCLUSIVE,
        extra={"aa_items": len(measured), "aa_worst_abs_err": worst},
    )


def nonfinite_row(check: str, named: dict[str, Tensor | None]) -> Row:
    """Non-finite values (NaN/Inf) in the plain twin's loss or gradients: ``== 0``, else the claim
    is INCONCLUSIVE (the baseline itself is broken), naming the first such tensor."""
    bad = [(name, nonfinite_count(t)) for name, t in named.items() if t is not None and nonfinite_count(t)]
    detail = (
        "every plain loss and gradient is finite"
        if not bad
        else f"the plain twin computes non-finite values (NaN/Inf), first in {bad[0][0]} ({bad[0][1]} element(s)); "
        f"{len(bad)} tensor(s) in all. Nothing can be compared: fix the model, data or loss first"
    )
    return Row(
        check=check,
        item="plain twin finite",
        variant="plain",
        metric="nonfinite_tensors",
        value=float(len(bad)),
        threshold="0",
        comparator="==",
        detail=detail,
        role=Role.NONFINITE,
        unit="tensors",
        threshold_value=0.0,
        on_miss=INCONCLUSIVE,
        extra={"first_nonfinite": bad[0][0] if bad else ""},
    )


#: Characters of an exception message kept in a row's detail (the first paragraph, at most).
MAX_MESSAGE = 600

#: What torch raises when no input of the graph requires grad (reentrant recompute, frozen input).
NO_GRAD_GRAPH = "does not require grad and does not have a grad_fn"


def raised_for_lack_of_grad(rows: list[Row]) -> bool:
    """True when the recompute run failed only because nothing upstream required grad."""
    return any(r.status == ERROR and r.item == "recompute" and NO_GRAD_GRAPH in r.detail for r in rows)


def exception_message(exc: BaseException) -> str:
    """The first paragraph of ``exc``'s message (torch appends long tips after a blank line), at most
    :data:`MAX_MESSAGE` characters, then its notes (``add_note``: what reportgen saw)."""
    message = str(exc).split("\n\n")[0]
    message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + " …"
    return message + "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))


def error_row(check: str, exc: BaseException, where: str, seconds: float = 0.0, twin: str | None = None) -> Row:
    """An exception inside a check, as data. ``where`` is "plain" or "recompute" or "check" (or, in a
    sharded check, "rank 1"); ``twin`` the twin that was running there (``plain``, ``aa``, ``recompute``;
    defaults to ``where`` when that names a twin). A baseline twin (plain or A/A) is recorded as
    column ``twin`` = :data:`reportgen.results.BASELINE`.

    A row of the plain twin (``where="plain"``) is an ERROR of the baseline (column ``twin`` =
    :data:`reportgen.results.BASELINE`): its check cannot be judged (:func:`reportgen.results.judged_status`).
    The detail holds the message's first paragraph (at most :data:`MAX_MESSAGE` characters), then
    the exception's notes (``add_note``), e.g. the output leaves that changed during backward."""
    twin = twin or (where if where in ("plain", "aa", "recompute") else None)
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    message = exception_message(exc)
    twin = twin or (where if where in ("plain", "aa", "recompute") else None)
    said = where if twin is None or where == twin else f"{twin} twin on {where}"
    if twin in BASELINE_TWINS:
        detail = f"the {said} run failed, so the claim cannot be tested: {type(exc).__name__}: {message}{at}"
    else:
        detail = f"the {said} run raised {type(exc).__name__}: {message}{at}"
    broke = {TWIN: BASELINE if twin in BASELINE_TWINS else twin} if twin else {}  # plain: nothing to judge against
    return Row(
        check=check,
        item=where,
        variant="recompute",
        metric="exception",
        value=float("nan"),
        threshold="",
        comparator="",
        status=ERROR,
        detail=detail,
        seconds=seconds,
        role=Role.EXCEPTION,
        extra={"exception_type": type(exc).__name__, **broke},
    )


def run_twin(check: str, where: str, fn: Callable[[], Any]) -> tuple[Any, list[Row]]:
    """Call ``fn``; on an exception return ``(None, [ERROR row])`` so the check can stop cleanly."""
    start = time.perf_counter()
    try:
        return fn(), []
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row
        return None, [error_row(check, exc, where, time.perf_counter() - start)]


def tagged_input_grad(row: Row) -> Row:
    """Mark a row measured in the fallback run whose input requires grad (used when the
    training-like recompute run raised, e.g. reentrant with no input requiring grad)."""
    row.item += " [input requires grad]"
    row.detail += "; measured with the input requiring grad, since the training-like run raised"
    return row


def trained_params_row(
    check: str,
    seed: int,
    plain: dict[str, Tensor],
    recompute: dict[str, Tensor],
    rtol: float | None,
    atol: float | None,
    factor: float,
    rounding: dict[str, Tensor] | None = None,
) -> Row:
    """One row for two trained twins' final parameters (``{plain name: tensor}`` each), judged
    ``allclose`` on the worst parameter's excess at the parity tolerances.

    Its value is the largest share of its tolerance any parameter uses (:func:`tolerance_used`,
    <= 1 within: the deciding number); ``max_rel_err`` is a column beside it. With ``rounding``
    (the rounding twin's final parameters, :mod:`reportgen.results.rounding`) each parameter outside
    tolerance is judged against ``factor`` times its rounding envelope too (column
    ``rounding_excess``: the worst parameter's, tolerance or envelope whichever passes more).
    """
    from reportgen.results.rounding import envelope

    rows = [
        tensor_row(check, name, plain.get(name), recompute.get(name), rtol, atol)
        for name in sorted(set(plain) | set(recompute))
    ]
    envelopes = envelope(plain, rounding) if rounding is not None else {}
    for row in rows:
        if row.item in envelopes:
            with_rounding(row, envelopes[row.item], factor)
    worst = max(rows, key=lambda r: r.extra["excess"] if r.extra["excess"] == r.extra["excess"] else float("inf"))
    used = max((tolerance_used(r) for r in rows), default=0.0)
    rel = max((r.extra.get("max_rel_err", float("inf")) for r in rows), default=0.0)
    moved = [r for r in rows if not r.extra["excess"] <= 0]
    far = [r for r in rows if not effective_excess(r) <= 0]
    extra = {
        "seed": seed,
        "excess": worst.extra["excess"],
        "worst_item": worst.item,
        "items": len(rows),
        "items_outside": len(moved),
        "max_rel_err": rel,
        "max_abs_err": worst.value,
    }
    detail = (
        f"all {len(rows)} trained parameters within tolerance (the worst, {worst.item}, uses {used:.0%} of it)"
        if not moved
        else f"{len(moved)} of {len(rows)} trained parameters differ beyond tolerance (worst {worst.item}, "
        f"max abs {worst.value:.3g}, {used:.3g}× its tolerance)"
    )
    if moved and envelopes:
        extra.update(
            rounding_excess=max(effective_excess(r) for r in rows),
            rounding_factor=factor,
            rounding_envelope=max(r.extra.get("rounding_envelope", float("nan")) for r in moved),
        )
        closest = max(envelope_used(r.value, r.extra.get("rounding_envelope", 0.0), factor) for r in moved)
        detail += (
            f"; every one {ROUNDING_LEVEL} (within {factor:g}× the rounding envelope, largest "
            f"{extra['rounding_envelope']:.3g}; the closest {_uses(closest, factor)})"
            if not far
            else f"; {len(far)} also outside {factor:g}× the rounding envelope (e.g. {far[0].item}): the twins trained apart"
        )
    elif moved:
        detail += ": the twins trained apart"
    return Row(
        check=check,
        item=f"seed {seed}",
        variant="recompute",
        metric="final_params_tolerance_used",
        value=used,
        threshold=worst.threshold,
        comparator="allclose",
        detail=detail,
        role=Role.FINAL_PARAMS,
        extra=extra,
    )


def difference_detail(plain: float, recompute: float, metric: str, higher_is_better: bool) -> str:
    """One sentence on what recompute did to the metric, e.g. ``recompute is worse by 0.012 (+3.1%)``."""
    if plain == recompute:
        return f"identical: {metric} {plain:.6g} in both runs"
    delta = recompute - plain
    better = (delta > 0) == bool(higher_is_better)
    rel = f" ({delta / abs(plain):+.2%} of plain)" if plain else ""
    return (
        f"plain {plain:.6g}, recompute {recompute:.6g}: recompute is {'better' if better else 'worse'} "
        f"by {abs(delta):.3g}{rel}"
    )


def metric_diff_row(
    check: str,
    seed: int,
    plain: float,
    recompute: float,
    allowed: float,
    metric: str,
    higher_is_better: bool,
    rounding: float | None = None,
    factor: float = 2.0,
) -> Row:
    """``|recompute - plain|`` of the held-out metric (row of ``check``) judged ``<= allowed``; with the rounding
    twin's metric ``rounding``, a difference within ``factor`` × ``|rounding - plain|`` passes
    too (column ``rounding_excess``)."""
    diff = abs(recompute - plain)
    extra = {"seed": seed, "plain_value": plain, "recompute_value": recompute}
    detail = difference_detail(plain, recompute, metric, higher_is_better)
    if rounding is not None:
        envelope_ = abs(rounding - plain)
        extra.update(rounding_envelope=envelope_, rounding_factor=factor, rounding_excess=diff - factor * envelope_)
        if diff > allowed:
            detail += (
                f"; {ROUNDING_LEVEL} (within {factor:g}× the rounding twin's {envelope_:.3g}: "
                f"{_uses(envelope_used(diff, envelope_, factor), factor)})"
                if diff <= factor * envelope_
                else f"; also outside {factor:g}× the rounding envelope {envelope_:.3g}"
            )
    return Row(
        check=check,
        item=f"seed {seed}",
        variant="recompute",
        metric=f"abs_diff_{metric}",
        value=diff,
        threshold=f"{allowed:g}",
        comparator="<=",
        detail=detail,
        role=Role.METRIC_DIFF,
        threshold_value=allowed,
        extra=extra,
    )
