"""Result rows for tests, one call each: thin wrappers of reportgen's own constructors
(:meth:`Row.measured`, :meth:`Row.fact`) with the defaults of a row built by hand (no unit, no
detail, no role), so that a test names only what it is about."""

from __future__ import annotations

import math

from reportgen.results import Role, Row, Status


def judged_row(
    check, item, metric, value, comparator, threshold_value, *, threshold=None, role="", detail="", unit="", **named
):
    """:meth:`Row.measured`: ``value`` ``comparator`` ``threshold_value`` gives PASS, else ``on_miss``
    (FAIL unless given); ``threshold``, the text for people, is ``threshold_value`` (``"0"``,
    ``"1e-05"``) unless given. ``named``: ``variant``, ``on_miss``, ``seconds``, ``extra``."""
    threshold = f"{threshold_value:g}" if threshold is None else threshold
    named |= {"comparator": comparator, "threshold_value": threshold_value, "role": role, "detail": detail}
    return Row.measured(check, item, metric, value, unit, threshold=threshold, **named)


def allclose_row(check, item, value, excess, *, role=Role.PARAM_GRAD, threshold="", extra=None, **named):
    """A tensor compared as the parity checks compare one: ``max_abs_err`` ``value``, judged by its
    ``excess`` (the largest difference past ``atol + rtol·|plain|``; <= 0 passes), the last of ``extra``;
    no ``threshold`` text unless given."""
    extra = {**(extra or {}), "excess": excess}
    return judged_row(
        check, item, "max_abs_err", value, "allclose", math.nan, role=role, threshold=threshold, extra=extra, **named
    )


def fact_row(check, item, metric, value=math.nan, *, role="", detail="", **named):
    """:meth:`Row.fact`, not judged: INFO unless ``status`` says otherwise. ``named``: ``status``,
    ``variant``, ``unit``, ``seconds``, ``extra``."""
    return Row.fact(check, item, role, detail, metric=metric, value=value, **named)


def raised_row(check, item, detail, *, role=Role.EXCEPTION, variant="recompute", **extra):
    """An ERROR row (metric ``exception``) whose ``detail`` is the exception's message; ``extra``
    its columns (``twin``, ``rank``)."""
    return fact_row(
        check, item, "exception", role=role, detail=detail, status=Status.ERROR, variant=variant, extra=extra
    )
