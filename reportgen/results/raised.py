"""Rows for exceptions: an exception inside a check becomes an ERROR row, never a crash."""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from reportgen.errors import InstrumentRefused
from reportgen.results.row import BASELINE, BASELINE_TWINS, TWIN, Role, Row, Status

#: Characters of an exception message kept in a row's detail (the first paragraph, at most).
MAX_MESSAGE = 600

#: What torch raises when no input of the graph requires grad (reentrant recompute, frozen input).
NO_GRAD_GRAPH = "does not require grad and does not have a grad_fn"


def raised_for_lack_of_grad(rows: list[Row]) -> bool:
    """True when the recompute run failed only because nothing upstream required grad."""
    return any(r.status == Status.ERROR and r.item == "recompute" and NO_GRAD_GRAPH in r.detail for r in rows)


def exception_message(exc: BaseException) -> str:
    """The first paragraph of ``exc``'s message (torch appends long tips after a blank line), at most
    :data:`MAX_MESSAGE` characters, then its notes (``add_note``: what reportgen saw)."""
    message = str(exc).split("\n\n")[0]
    message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + " …"
    return message + "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))


def raised_status(exc: BaseException, otherwise: str = Status.ERROR) -> str:
    """The status of a row made from ``exc``: ``otherwise`` (the row's own severity on a miss), but INCONCLUSIVE
    where that would fail the claim (ERROR, FAIL) and reportgen's own instrument could not run the model
    (:class:`reportgen.errors.InstrumentRefused`: nothing of the model is blamed). An advisory row (WARN) stays
    WARN whatever raised in its instrument."""
    refused = isinstance(exc, InstrumentRefused) and otherwise in (Status.ERROR, Status.FAIL)
    return Status.INCONCLUSIVE if refused else otherwise


@contextlib.contextmanager
def raised_in(twin: str) -> Iterator[None]:
    """Mark an exception raised inside with the twin that raised it (``reportgen_twin``; the innermost mark
    stays), for the row's ``twin`` column: an ERROR row of the plain twin (:data:`reportgen.results.BASELINE`)
    leaves the check without a baseline (INCONCLUSIVE), never a recompute FAIL; a WARN row (an advisory figure,
    e.g. the step peak under ``memory.peak_on_miss``) stays a WARN."""
    try:
        yield
    except Exception as exc:
        if not hasattr(exc, "reportgen_twin"):
            exc.reportgen_twin = twin  # type: ignore[attr-defined]
        raise


def twin_column(twin: str | None) -> dict[str, str]:
    """The ``twin`` column of a row about a twin that broke: :data:`reportgen.results.BASELINE` for the plain or A/A
    twin (its check cannot be judged), the twin's name otherwise; no column when no twin is known."""
    return {TWIN: BASELINE if twin in BASELINE_TWINS else twin} if twin else {}


def error_row(check: str, exc: BaseException, where: str, seconds: float = 0.0, twin: str | None = None) -> Row:
    """An exception inside a check, as data (its detail carries :func:`exception_message`). ``where`` is "plain"
    or "recompute" or "check" (or, in a sharded check, "rank 1"); ``twin`` the twin that was running there
    (``plain``, ``aa``, ``recompute``; defaults to the twin :func:`raised_in` marked, else to ``where`` when that
    names a twin). A baseline twin's (plain or
    A/A) row has column ``twin`` = :data:`reportgen.results.BASELINE`: its check cannot be judged
    (:func:`reportgen.results.judged_status`)."""
    twin = twin or getattr(exc, "reportgen_twin", None) or (where if where in ("plain", "aa", "recompute") else None)
    last = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {last[0].filename.rsplit('/', 1)[-1]}:{last[0].lineno})" if last else ""
    message = exception_message(exc)
    said = where if twin is None or where == twin else f"{twin} twin on {where}"
    if twin in BASELINE_TWINS:
        detail = f"the {said} run failed, so the claim cannot be tested: {type(exc).__name__}: {message}{at}"
    else:
        detail = f"the {said} run raised {type(exc).__name__}: {message}{at}"
    extra = {"exception_type": type(exc).__name__, **twin_column(twin)}  # plain: nothing to judge against
    return Row.fact(
        check,
        where,
        Role.EXCEPTION,
        detail,
        status=raised_status(exc),
        metric="exception",
        seconds=seconds,
        extra=extra,
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
