"""Row builders shared by the parity checks."""
from __future__ import annotations

import time
import traceback
from typing import Any, Callable

from torch import Tensor

from ..distance import judge, measure, tolerances
from ..results import ERROR, FAIL, PASS, Row


def tensor_row(check: str, item: str, plain: Tensor | None, recompute: Tensor | None, rtol: float | None,
               atol: float | None) -> Row:
    """Compare one tensor of the recompute run with the plain run's.

    ``None`` in one run and a tensor in the other is FAIL (a gradient that silently
    vanished); ``None`` in both is PASS with a note.
    """
    if plain is None or recompute is None:
        if plain is None and recompute is None:
            return Row(check, item, "recompute", "max_abs_err", 0.0, "", "allclose", PASS, "None in both runs")
        missing = "recompute" if recompute is None else "plain"
        return Row(check, item, "recompute", "max_abs_err", float("inf"), "", "allclose", FAIL,
                   f"None in the {missing} run, a tensor in the other: this parameter would not train the same")
    rt, at = tolerances(plain.dtype, rtol, atol)
    d = measure(recompute, plain, rt, at)
    ok = judge(d)
    detail = "bitwise equal" if d.bitwise_equal else ("within tolerance" if ok else f"exceeds tolerance by {d.worst_excess:.3g}")
    if recompute.shape != plain.shape:
        detail = f"shape {tuple(recompute.shape)} vs plain {tuple(plain.shape)}"
    return Row(check, item, "recompute", "max_abs_err", d.max_abs_err, f"atol={at:g} rtol={rt:g}", "allclose",
               PASS if ok else FAIL, detail,
               extra={"max_rel_err": d.max_rel_err, "bitwise_equal": d.bitwise_equal, "atol": at, "rtol": rt})


def value_row(check: str, item: str, plain: Any, recompute: Any) -> Row:
    """Compare a plain Python value (number, bool, string, length) between the twins."""
    same = plain == recompute
    numeric = all(isinstance(v, (int, float)) for v in (plain, recompute))
    value = abs(float(recompute) - float(plain)) if numeric else (0.0 if same else float("nan"))
    return Row(check, item, "recompute", "abs_diff" if numeric else "equal", value, "0" if numeric else "", "==",
               PASS if same else FAIL, f"plain={plain!r}, recompute={recompute!r}")


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
    return Row(check, where, "recompute", "exception", float("nan"), "", "", ERROR, detail, seconds)


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
