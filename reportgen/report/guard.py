"""Rendering never crashes on a missing value (a failed measurement, a CI that could not be computed): a section
whose template fails on its rows falls back to the generic rows table, and page-1 costs with a missing or
non-finite figure become "not measured"."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from jinja2 import Environment

from reportgen.checks import ROWS_TEMPLATE  # the generic rows table: every value through ``num`` (— for None)

log = logging.getLogger("reportgen")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def guard_sections(env: Environment, sections: list[dict]) -> list[dict]:
    """Give each of the view model's ``sections`` a template that renders with its rows in ``env`` (the
    report's, ``render.environment()``), falling back to the generic table; ``template`` and ``intro`` are
    changed in place, and ``sections`` returned."""
    for section in sections:
        if section["template"] == ROWS_TEMPLATE:
            continue
        try:
            env.get_template(section["template"]).render(section=section, medium="pdf")
        except Exception as exc:  # noqa: BLE001 - any template failure falls back to the table
            log.warning(
                "section %s: its layout failed on these rows (%s: %s); showing the rows table",
                section["check"],
                type(exc).__name__,
                exc,
            )
            section["template"] = ROWS_TEMPLATE
            section["intro"] = (
                f"{section['intro']} This run left values empty that the usual layout of this "
                "section needs, so its rows are listed as they are (all in results.csv)."
            ).strip()
    return sections


def guard_costs(headline: Callable[[Any], dict], frame: Any) -> dict:
    """Page-1 costs from ``headline(frame)`` (``render.headline_costs`` of the results frame), with any missing or
    non-finite figure made "not measured": ``{"memory": dict | None, "peak": dict | None, "time": dict | None}``;
    ``time["low"]``/``["high"]`` are both None unless both are finite."""
    try:
        costs = headline(frame)
    except Exception as exc:  # noqa: BLE001 - a missing figure is "not measured", never a crash
        log.warning("page-1 costs not shown (%s: %s)", type(exc).__name__, exc)
        return {"memory": None, "peak": None, "time": None}
    memory, peak, time = costs.get("memory"), costs.get("peak"), costs.get("time")
    if memory and not all(_finite(memory.get(k)) for k in ("plain", "recompute", "saved", "share")):
        memory = None
    if peak and not all(_finite(peak.get(k)) for k in ("plain", "recompute", "saved", "share")):
        peak = None
    if time is not None:
        if not _finite(time.get("ratio")):
            time = None
        elif not (_finite(time.get("low")) and _finite(time.get("high"))):
            time = {**time, "low": None, "high": None}
    return {**costs, "memory": memory, "peak": peak, "time": time}
