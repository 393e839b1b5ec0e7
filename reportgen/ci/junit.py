"""junit.xml: the run as JUnit XML, the format CI test reporters read (GitHub, GitLab, Jenkins).

One ``<testsuite>`` per run inside ``<testsuites>``; one ``<testcase>`` per check, per clause of
the release claim (and a ``<skipped>`` "claim sentence" when the sentence states what no clause judges),
and one for the claim verdict itself, so the report is red whenever the
claim does not hold (also when only a NOT_RUN check makes it fail). A required check or clause
that FAILs carries ``<failure>`` with the failing rows, the likely cause and the fix; one that
raised or cannot be judged (INCONCLUSIVE) carries ``<error>``; NOT_RUN is ``<skipped>``. A check that is not
required (an informational or flagged experiment) never fails the suite: its status is in
``<system-out>``. Built with :mod:`xml.etree.ElementTree` (escaping is the library's).
"""

from __future__ import annotations

import math
import socket
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from typing import Any

import pandas as pd

from reportgen.claim.rows import claim_table, not_judged
from reportgen.config import RELEASE_CLAIM
from reportgen.results import Role, Status, check_summary
from reportgen.results.row import to_float

#: File name in the run folder.
JUNIT_NAME = "junit.xml"
#: The statuses of rows that do not pass, listed under a failing case.
NOT_PASSING = [Status.FAIL, Status.ERROR, Status.NOT_RUN, Status.INCONCLUSIVE]


def _seconds(value: Any) -> str:
    """Seconds with 3 decimals (the SUREFIRE time form reporters parse)."""
    value = to_float(value)
    return f"{value:.3f}" if math.isfinite(value) and value >= 0 else "0.000"


def _failing_text(rows: pd.DataFrame, most: int = 8) -> str:
    """The failing rows of a check, one line each: item, status, value vs threshold, detail."""
    lines = [
        f"{r['status']} {r['item']} [{r['variant']}] {r['metric']} = {r['value']} "
        f"(threshold {r['threshold'] or '-'}): {r['detail']}"
        for r in rows.head(most).to_dict("records")
    ]
    if len(rows) > most:
        lines.append(f"... and {len(rows) - most} more rows in results.csv")
    return "\n".join(lines)


def _diagnoses(frame: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """``{check: (cause, fix)}`` from the diagnosis rows (reportgen.diagnose)."""
    if "fix" not in frame.columns:
        return {}
    rows = frame[frame.role == Role.DIAGNOSIS]
    return {r["check"]: (str(r.get("cause") or ""), str(r.get("fix") or "")) for r in rows.to_dict("records")}


def _outcome(case: ET.Element, status: str, required: bool, message: str, text: str) -> str:
    """Add the child that says how a test case ended; returns ``failure``/``error``/``skipped``/``passed``."""
    tags: dict[str, str] = {Status.FAIL: "failure", Status.ERROR: "error", Status.INCONCLUSIVE: "error"}
    tag = (tags.get(status) if required else None) or ("skipped" if status == Status.NOT_RUN else "")
    if tag:
        ET.SubElement(case, tag, message=message, type=status).text = text
        return tag
    if status not in (Status.PASS,) or not required:
        ET.SubElement(case, "system-out").text = f"{status}{'' if required else ' (not required)'}: {message}"
    return "passed"


def junit_xml(
    frame: pd.DataFrame, verdict: str, required: Iterable[str], suite: str, command: str = "", detectors: str = ""
) -> bytes:
    """The run as JUnit XML (UTF-8 bytes with an XML declaration), from the results frame (clause rows included),
    the claim verdict and the checks it needs; ``suite`` is the suite's name (the model and the run folder, say),
    ``command`` the verify command, named in the verdict case when it fails; ``detectors`` the sentence a run
    whose detector controls did not run states (:func:`reportgen.results.frame.detectors`), a suite property."""
    required = set(required)
    diagnoses = _diagnoses(frame)
    summary = check_summary(frame[frame.check != RELEASE_CLAIM], required - {RELEASE_CLAIM})  # clauses: their own cases
    root, suite_el, counts = _suites("reportgen", suite)
    if detectors:  # stated wherever the verdict is: a CI page reads the properties
        ET.SubElement(ET.SubElement(suite_el, "properties"), "property", name="detectors", value=detectors)
    seconds = frame.groupby("check", sort=False)["seconds"].sum() if len(frame) else pd.Series(dtype=float)
    for s in summary.to_dict("records"):
        case = ET.SubElement(
            suite_el,
            "testcase",
            classname="reportgen.check",
            name=s["check"],
            time=_seconds(seconds.get(s["check"], 0.0)),
        )
        rows = frame[(frame.check == s["check"]) & frame.status.isin(NOT_PASSING)]
        cause, fix = diagnoses.get(s["check"], ("", ""))
        text = _failing_text(rows) + (f"\nLikely cause: {cause}.\nFix: {fix}." if fix else "")
        message = f"{s['check']}: {s['status']}, {s['failing']} of {s['rows']} rows not passing"
        counts[_outcome(case, s["status"], bool(s["required"]), message, text)] += 1
    for c in claim_table(frame):
        case = ET.SubElement(
            suite_el, "testcase", classname="reportgen.claim", name=f"clause: {c['clause']}", time="0.000"
        )
        message = f"{c['clause']}: {c['outcome']} (measured {c['value']}, bound {c['bound']})"
        text = f"{c['detail']}\nFix: {c['fix']}." if c["fix"] else c["detail"]
        counts[_outcome(case, c["status"], RELEASE_CLAIM in required, message, text)] += 1
    if left := not_judged(frame):  # the sentence states what no clause judges: skipped, never passed
        case = ET.SubElement(suite_el, "testcase", classname="reportgen.claim", name="claim sentence", time="0.000")
        said = f"not judged: the sentence states {'; '.join(left)}, which no clause judges; the verdict covers the clauses only"
        counts[_outcome(case, Status.NOT_RUN, True, said, said)] += 1
    case = ET.SubElement(suite_el, "testcase", classname="reportgen", name="claim verdict", time="0.000")
    said = {str(Status.PASS): "the claim holds", str(Status.INCONCLUSIVE): "the claim cannot be judged"}.get(
        verdict, "the claim fails"
    )
    status = verdict if verdict in (Status.PASS, Status.INCONCLUSIVE) else Status.FAIL
    text = f"verdict {verdict}; open report.html; check the signature with {command}" if command else said
    counts[_outcome(case, status, True, f"verdict {verdict}: {said}", text)] += 1
    return _finished(root, suite_el, counts, _seconds(seconds.sum() if len(seconds) else 0.0), skipped_first=True)


def _suites(name: str, suite: str) -> tuple[ET.Element, ET.Element, dict[str, int]]:
    """``<testsuites name>`` holding one ``<testsuite>`` named ``suite``, and zero outcome counts."""
    root = ET.Element("testsuites", name=name)
    suite_el = ET.SubElement(root, "testsuite", name=suite, hostname=socket.gethostname())
    return root, suite_el, dict.fromkeys(("failure", "error", "skipped", "passed"), 0)


def _finished(
    root: ET.Element, suite_el: ET.Element, counts: dict[str, int], time: str, skipped_first: bool = False
) -> bytes:
    """The totals on the suite and (but ``skipped``) on the root; the document as UTF-8 bytes."""
    totals = {"tests": str(sum(counts.values())), "failures": str(counts["failure"]), "errors": str(counts["error"])}
    skipped = {"skipped": str(counts["skipped"])}
    suite_el.attrib.update(
        {**totals, **skipped, "time": time} if skipped_first else {**totals, "time": time, **skipped}
    )
    root.attrib.update({**totals, "time": time})
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def sweep_junit_xml(jobs: list[dict[str, Any]], suite: str, swept: list[str] | None = None) -> bytes:
    """A sweep as JUnit XML: one ``<testcase>`` per job (named by its number and overrides).

    Exit code 0 passes; 1 (the claim fails) is a ``<failure>`` naming the checks and clauses that
    did not pass; 3 (cannot be judged), 2, 70 or a job without an outcome is an ``<error>``.

    ``jobs`` are ``reportgen.sweep.load_jobs``'s records (``job``, ``dir``, ``overrides``, ``exit_code``,
    ``verdict``, ``error``, ``frame``, ``required``); ``swept`` the override keys that differ between jobs: a case
    is named by those alone (all of the job's overrides without them).
    """
    root, suite_el, counts = _suites("reportgen sweep", suite)
    total_seconds = 0.0
    for job in jobs:
        frame = job.get("frame")
        seconds = float(frame.seconds.sum()) if frame is not None and len(frame) else 0.0
        total_seconds += seconds
        shown = [o for o in job["overrides"] if not swept or o.lstrip("+~").split("=", 1)[0] in swept]
        name = f"job {job['job']}: {' '.join(shown) or '(no overrides)'}"
        case = ET.SubElement(suite_el, "testcase", classname="reportgen.sweep", name=name, time=_seconds(seconds))
        code = int(job["exit_code"])
        status = Status.PASS if code == 0 else Status.FAIL if code == 1 else Status.ERROR
        text = f"{job['dir']}/report.html: verdict {job['verdict']}, exit code {code}"
        if frame is not None and len(frame) and code == 1:
            text += "\n" + _failing_text(frame[frame.status.isin(NOT_PASSING) & frame.check.isin(job["required"])])
        message = job.get("error") or f"verdict {job['verdict']} (exit {code})"
        counts[_outcome(case, status, True, message, text)] += 1
    return _finished(root, suite_el, counts, _seconds(total_seconds))


def comparison_junit_xml(result: dict[str, Any], suite: str) -> bytes:
    """A comparison of two signed runs (``reportgen.compare``) as JUnit XML.

    Test cases: each side verifies; NEW's claim holds; the overhead ratio did not rise past its
    limit; the saved-activation share did not fall past its limit. A regression is a
    ``<failure>``; a rise that cannot be told from noise an ``<error>`` ("cannot tell"); a
    figure one side did not measure ``<skipped>``.

    ``result`` is ``reportgen.compare.derive.compare``'s.
    """
    costs, limits, regressions = result["costs"], result["limits"], result["regressions"]
    overhead, saving = costs["overhead_change_pp"], costs["saving_change_pp"]

    def said(prefix: str) -> str | None:
        return next((r for r in [*regressions, *result["unclear"]] if r.startswith(prefix)), None)

    def status(prefix: str, measured: Any) -> str:
        hit = said(prefix)
        if measured is None:
            return Status.NOT_RUN
        return Status.PASS if hit is None else Status.FAIL if hit in regressions else Status.ERROR

    cases: list[tuple[str, str, str]] = [
        (f"{label} verifies", Status.FAIL if said(label) else Status.PASS, said(label) or f"{label} verifies")
        for label in ("BASE", "NEW")
    ]
    cases += [
        (
            "NEW's claim holds",
            Status.PASS if result["verdicts"]["new"] == Status.PASS else Status.FAIL,
            said("NEW's claim") or f"NEW's claim verdict {result['verdicts']['new']}",
        ),
        (
            f"overhead ratio rises at most {limits['max_overhead_increase_pp']:g} pp",
            status("overhead ratio rose", overhead),
            said("overhead ratio rose") or f"change {overhead} pp",
        ),
        (
            f"saved-activation share falls at most {limits['max_saving_decrease_pp']:g} pp",
            status("saved-activation share fell", saving),
            said("saved-activation share fell") or f"change {saving} pp",
        ),
    ]
    root, suite_el, counts = _suites("reportgen compare", suite)
    for name, state, message in cases:
        case = ET.SubElement(suite_el, "testcase", classname="reportgen.compare", name=name, time="0.000")
        counts[_outcome(case, state, True, message, message)] += 1
    return _finished(root, suite_el, counts, "0.000")
