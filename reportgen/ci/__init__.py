"""Outputs CI systems read, written into the run folder (docs/ci.md).

``junit.xml`` (:mod:`.junit`) and ``summary.md`` (:mod:`.summary`) are written before signing,
so the signed statement covers them; ``verdict.json`` (:mod:`.verdict`) after, bound to the
statement by its digest. :func:`write_ci_outputs` and :func:`finish_ci_outputs` are the two
pipeline hooks.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from reportgen.ci.junit import JUNIT_NAME, junit_xml
from reportgen.ci.summary import SUMMARY_NAME, append_step_summary, summary_markdown
from reportgen.ci.verdict import VERDICT_NAME, write_verdict
from reportgen.files import atomic_write


def write_ci_outputs(frame: pd.DataFrame, meta: dict, verdict: str, required: Iterable[str], out_dir: Path) -> None:
    """junit.xml and summary.md into ``out_dir`` (before signing: the statement lists them)."""
    required = list(required)
    out_dir = Path(out_dir)
    command = f"python -m reportgen.verify {out_dir} --key signing-key.pub.pem"
    suite = f"reportgen {meta['claim']['model']} ({out_dir.name})"
    atomic_write(out_dir / JUNIT_NAME, junit_xml(frame, verdict, required, suite, command, meta.get("detectors", "")))
    atomic_write(out_dir / SUMMARY_NAME, summary_markdown(frame, meta, verdict, required, out_dir))


def finish_ci_outputs(frame: pd.DataFrame, verdict: str, out_dir: Path) -> None:
    """After signing: verdict.json (bound to the statement's digest), then the job summary appended
    to ``$GITHUB_STEP_SUMMARY`` when set."""
    out_dir = Path(out_dir)
    write_verdict(frame, verdict, out_dir)
    append_step_summary((out_dir / SUMMARY_NAME).read_text(encoding="utf-8"))


__all__ = ["VERDICT_NAME", "finish_ci_outputs", "write_ci_outputs", "write_verdict"]
