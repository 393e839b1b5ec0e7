"""Row builders shared by the checks: compare a tensor or a value between the twins, turn an
exception into an ERROR row. Checks never import each other; what they share lives here."""
from __future__ import annotations

import time
import traceback
from typing import Any, Callable

from torch import Tensor

from .distance import measure, tolerances
from .results import ERROR, Role, Row


def tensor_row(check: str, item: str, plain: Tensor | None, recompute: Tensor | None, rtol: float | None,
               atol: float | None, role: str = "") -> Row:
    """Measure how far one tensor of the recompute run is from the plain run's.

    The row is judged by :func:`reportgen.results.judge` with comparator ``allclose`` on the
    ``excess`` column (``max(|a - b| - (atol + rtol |b|))``, <= 0 passes). ``None`` in one run
    and a tensor in the other has excess inf (a gradient that silently vanished); ``None`` in
    both has excess 0, with a note.
    """
    if plain is None or recompute is None:
        if plain is None and recompute is None:
            return Row(check, item, "recompute", "max_abs_err", 0.0, "", "allclose", detail="None in both runs",
                       role=role, extra={"excess": 0.0})
        missing = "recompute" if recompute is None else "plain"
        return Row(check, item, "recompute", "max_abs_err", float("inf"), "", "allclose", role=role,
                   detail=f"None in the {missing} run, a tensor in the other: it would not train the same",
                   extra={"excess": float("inf")})
    rt, at = tolerances(plain.dtype, rtol, atol)
    d = measure(recompute, plain, rt, at)
    detail = ("bitwise equal" if d.bitwise_equal else
              "within tolerance" if d.worst_excess <= 0 else f"exceeds tolerance by {d.worst_excess:.3g}")
    if recompute.shape != plain.shape:
        detail = f"shape {tuple(recompute.shape)} vs plain {tuple(plain.shape)}"
    return Row(check, item, "recompute", "max_abs_err", d.max_abs_err, f"atol={at:g} rtol={rt:g}", "allclose",
               detail=detail, role=role,
               extra={"max_rel_err": d.max_rel_err, "bitwise_equal": d.bitwise_equal, "atol": at, "rtol": rt,
                      "excess": d.worst_excess})


def value_row(check: str, item: str, plain: Any, recompute: Any, role: str = "") -> Row:
    """Compare a plain Python value (number, bool, string, length) between the twins: numbers
    by ``abs_diff == 0``, anything else by ``mismatch == 0`` (1 when they differ)."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (plain, recompute))
    value = abs(float(recompute) - float(plain)) if numeric else float(plain != recompute)
    return Row(check, item, "recompute", "abs_diff" if numeric else "mismatch", value, "0", "==",
               detail=f"plain={plain!r}, recompute={recompute!r}", role=role, threshold_value=0.0)


#: Characters of an exception message kept in a row's detail (the first paragraph, at most).
MAX_MESSAGE = 600

#: What torch raises when no input of the graph requires grad (reentrant recompute, frozen input).
NO_GRAD_GRAPH = "does not require grad and does not have a grad_fn"


def raised_for_lack_of_grad(rows: list[Row]) -> bool:
    """True when the recompute run failed only because nothing upstream required grad."""
    return any(r.status == ERROR and r.item == "recompute" and NO_GRAD_GRAPH in r.detail for r in rows)


def error_row(check: str, exc: BaseException, where: str, seconds: float = 0.0) -> Row:
    """An exception inside a check, as data. ``where`` is "plain" or "recompute" or "check"."""
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    message = str(exc).split("\n\n")[0]  # torch appends long tips after a blank line
    message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + " …"
    if where == "plain":
        detail = f"the plain run failed, so the claim cannot be tested: {type(exc).__name__}: {message}{at}"
    else:
        detail = f"the {where} run raised {type(exc).__name__}: {message}{at}"
    return Row(check, where, "recompute", "exception", float("nan"), "", "", ERROR, detail, seconds, role=Role.EXCEPTION)


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
