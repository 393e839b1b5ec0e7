"""summary.md: the run for a CI job page (GitHub's job summary, a GitLab artifact), from ``templates/summary.md.j2``.

The verdict, the release claim's table, the failing rows, the fix and the verify command, in
GitHub-flavoured Markdown. Every name from the run (checks, items, clauses, details) goes
through :func:`md`, so a ``|`` or ``<`` in a tensor name cannot break the table or inject HTML.
:func:`append_step_summary` appends it to ``$GITHUB_STEP_SUMMARY`` when that is set: appended,
never overwritten, and writing it never changes the exit code.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from reportgen.ci.junit import NOT_PASSING
from reportgen.claim.rows import claim_table, not_judged
from reportgen.config import RELEASE_CLAIM
from reportgen.paths import templates_dir
from reportgen.results import Role, Status

log = logging.getLogger("reportgen")

#: File name in the run folder.
SUMMARY_NAME = "summary.md"
#: Characters with a meaning in GitHub-flavoured Markdown tables and inline text.
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()#+!|~])")
SAID: dict[str, str] = {Status.PASS: "HOLDS", Status.INCONCLUSIVE: "CANNOT BE JUDGED"}


def md(value: Any) -> str:
    """``value`` as inline Markdown text: HTML's ``& < >`` as entities, Markdown punctuation
    backslash-escaped, line breaks as spaces (a table cell is one line)."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN.sub(r"\\\1", " ".join(text.split()))


def environment() -> Environment:
    """jinja2 for Markdown: no HTML autoescape (escaping is :func:`md`'s), StrictUndefined."""
    env = Environment(
        loader=FileSystemLoader(str(templates_dir())),
        autoescape=False,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["md"] = md
    return env


def fixes(frame: pd.DataFrame) -> list[dict[str, str]]:
    """One ``{"checks", "fix"}`` per distinct fix of the diagnosis rows (reportgen.diagnose)."""
    if "fix" not in frame.columns:
        return []
    said: dict[str, list[str]] = {}
    for check, fix in frame.loc[frame.role == Role.DIAGNOSIS, ["check", "fix"]].values:
        said.setdefault(str(fix), []).append(str(check))
    return [{"checks": ", ".join(checks), "fix": fix} for fix, checks in said.items()]


def summary_markdown(frame: pd.DataFrame, meta: dict, verdict: str, required: Iterable[str], out_dir: Path) -> str:
    """summary.md's text (see the module docstring)."""
    template = environment().get_template("summary.md.j2")
    # up to 10 rows of required checks that FAIL, ERROR, are NOT_RUN or INCONCLUSIVE (clauses apart)
    bad = frame[frame.status.isin(NOT_PASSING) & frame.check.isin(list(required)) & (frame.check != RELEASE_CLAIM)]
    return template.render(
        verdict=verdict,
        said=SAID.get(verdict, "FAILS"),
        detectors=meta.get("detectors", ""),
        model=meta["claim"]["model"],
        release=meta["claim"].get("release"),
        clauses=claim_table(frame),
        not_judged=not_judged(frame),
        failing=bad.head(10)[["check", "item", "status", "detail"]].to_dict("records"),
        fixes=fixes(frame),
        out_dir=str(out_dir),
        signed=bool(meta.get("signature")),
    )


def append_step_summary(text: str, environ: dict | None = None) -> Path | None:
    """Append ``text`` to ``$GITHUB_STEP_SUMMARY`` when it is set (never truncating it).

    Returns:
        The file appended to, or None when the variable is unset or the write failed (logged:
        the job summary is a courtesy and never changes the run's exit code).
    """
    target = (environ if environ is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(("\n" if Path(target).exists() and Path(target).stat().st_size else "") + text)
    except OSError as exc:
        log.warning("could not append to $GITHUB_STEP_SUMMARY (%s): %s", target, exc)
        return None
    return Path(target)


def comparison_markdown(result: dict[str, Any], base: str, new: str, out_dir: Path) -> str:
    """summary.md of a comparison (``templates/compare-summary.md.j2``): outcome, both verdicts,
    the cost changes, each regression and what cannot be told."""
    template = environment().get_template("compare-summary.md.j2")
    return template.render(result=result, base=base, new=new, out_dir=str(out_dir))
